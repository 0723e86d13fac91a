//! World size from the launcher's own options (torchrun, accelerate, deepspeed, mpirun).

use std::ffi::OsString;
use std::path::Path;

use super::World;

use super::last_flag_value as option;

/// The launcher's own arguments: everything before the training script or module.
fn launcher_region(args: &[&str]) -> usize {
    args.iter()
        .position(|a| a.ends_with(".py") || *a == "-m" || *a == "--module")
        .unwrap_or(args.len())
}

fn visible_devices(env: &dyn Fn(&str) -> Option<OsString>) -> Option<u64> {
    let v = env("CUDA_VISIBLE_DEVICES")?;
    let v = v.to_string_lossy();
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    Some(v.split(',').filter(|s| !s.trim().is_empty()).count() as u64)
}

pub fn world_size(argv: &[OsString], env: &dyn Fn(&str) -> Option<OsString>) -> World {
    let strs: Vec<&str> = argv.iter().map(|a| a.to_str().unwrap_or("")).collect();
    let prog = Path::new(strs[0])
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    let rest = &strs[1..];

    let single = || World {
        size: 1,
        source: "single process (no distributed launcher)".into(),
        uncertain: false,
    };

    // torchrun, or python -m torch.distributed.run / .launch
    let torchrun_args: Option<&[&str]> = if prog == "torchrun" {
        Some(rest)
    } else if prog.starts_with("python") {
        match rest.iter().position(|a| *a == "-m") {
            Some(p)
                if matches!(
                    rest.get(p + 1),
                    Some(&"torch.distributed.run") | Some(&"torch.distributed.launch")
                ) =>
            {
                Some(&rest[p + 2..])
            }
            _ => None,
        }
    } else {
        None
    };

    if let Some(args) = torchrun_args {
        let region = &args[..launcher_region(args)];
        let (per_node, mut uncertain, mut source) = match option(
            region,
            &["--nproc_per_node", "--nproc-per-node"],
        ) {
            None => (1, false, "torchrun default --nproc_per_node 1".to_string()),
            Some(v) => match v.parse::<u64>() {
                Ok(n) => (n, false, format!("torchrun --nproc_per_node {n}")),
                Err(_) => match visible_devices(env) {
                    Some(n) => (
                        n,
                        false,
                        format!("torchrun --nproc_per_node {v}: {n} GPUs in CUDA_VISIBLE_DEVICES"),
                    ),
                    None => (
                        1,
                        true,
                        format!(
                            "torchrun --nproc_per_node {v}: GPU count unknown here (set CUDA_VISIBLE_DEVICES); assuming 1"
                        ),
                    ),
                },
            },
        };
        let nodes = match option(region, &["--nnodes"]) {
            None => 1,
            Some(v) => match v.parse::<u64>() {
                Ok(n) => {
                    source.push_str(&format!(" × --nnodes {n}"));
                    n
                }
                Err(_) => {
                    // Elastic "MIN:MAX": the world size is not known before launch.
                    let min = v
                        .split(':')
                        .next()
                        .and_then(|m| m.parse().ok())
                        .unwrap_or(1);
                    uncertain = true;
                    source.push_str(&format!(" × --nnodes {v} (elastic; assuming {min})"));
                    min
                }
            },
        };
        return World {
            size: per_node.saturating_mul(nodes),
            source,
            uncertain,
        };
    }

    if prog == "accelerate" && rest.first() == Some(&"launch") {
        let args = &rest[1..];
        let region = &args[..launcher_region(args)];
        return match option(region, &["--num_processes", "--num-processes"])
            .and_then(|v| v.parse::<u64>().ok())
        {
            Some(n) => World {
                size: n,
                source: format!("accelerate launch --num_processes {n}"),
                uncertain: false,
            },
            None => World {
                size: 1,
                source: "accelerate launch without --num_processes (the accelerate config decides); assuming 1"
                    .into(),
                uncertain: true,
            },
        };
    }

    if prog == "deepspeed" {
        let region = &rest[..launcher_region(rest)];
        let nodes = option(region, &["--num_nodes", "--num-nodes"])
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1);
        return match option(region, &["--num_gpus", "--num-gpus"])
            .and_then(|v| v.parse::<u64>().ok())
        {
            Some(n) => World {
                size: n.saturating_mul(nodes),
                source: format!("deepspeed --num_gpus {n} × --num_nodes {nodes}"),
                uncertain: false,
            },
            None => match visible_devices(env) {
                Some(n) => World {
                    size: n.saturating_mul(nodes),
                    source: format!("deepspeed: {n} GPUs in CUDA_VISIBLE_DEVICES"),
                    uncertain: false,
                },
                None => World {
                    size: nodes,
                    source: "deepspeed uses every visible GPU; count unknown here (set CUDA_VISIBLE_DEVICES or --num_gpus); assuming 1 per node".into(),
                    uncertain: true,
                },
            },
        };
    }

    if (prog == "mpirun" || prog == "mpiexec")
        && let Some(n) = option(rest, &["-np", "-n"]).and_then(|v| v.parse::<u64>().ok())
    {
        return World {
            size: n,
            source: format!("{prog} -np {n}"),
            uncertain: false,
        };
    }
    single()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(cmd: &str, cvd: Option<&str>) -> World {
        let argv: Vec<OsString> = cmd.split_whitespace().map(OsString::from).collect();
        let cvd = cvd.map(OsString::from);
        world_size(&argv, &move |k| {
            if k == "CUDA_VISIBLE_DEVICES" {
                cvd.clone()
            } else {
                None
            }
        })
    }

    #[test]
    fn torchrun_spellings() {
        assert_eq!(ws("torchrun --nproc_per_node=4 t.py --x 1", None).size, 4);
        assert_eq!(
            ws("torchrun --nproc-per-node 2 --nnodes 2 t.py", None).size,
            4
        );
        let w = ws("torchrun --nproc_per_node gpu t.py", Some("0,1,2"));
        assert_eq!((w.size, w.uncertain), (3, false));
        let w = ws("torchrun --nproc_per_node auto t.py", None);
        assert_eq!((w.size, w.uncertain), (1, true));
        assert_eq!(
            ws(
                "python -m torch.distributed.run --nproc_per_node 8 t.py",
                None
            )
            .size,
            8
        );
        let w = ws("torchrun --nnodes 1:4 --nproc_per_node 2 t.py", None);
        assert_eq!((w.size, w.uncertain), (2, true));
    }

    #[test]
    fn script_flags_do_not_count() {
        // --nproc_per_node after the script belongs to the script.
        assert_eq!(ws("torchrun t.py --nproc_per_node 4", None).size, 1);
    }

    #[test]
    fn other_launchers() {
        assert_eq!(ws("accelerate launch --num_processes 8 t.py", None).size, 8);
        assert!(ws("accelerate launch t.py", None).uncertain);
        assert_eq!(ws("deepspeed --num_gpus 4 t.py", None).size, 4);
        assert_eq!(ws("deepspeed t.py", Some("0,1")).size, 2);
        assert_eq!(ws("mpirun -np 8 ./train", None).size, 8);
        assert_eq!(ws("python train.py", None).size, 1);
    }
}
