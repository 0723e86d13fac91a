//! Launchers: the world size from their own options (torchrun, accelerate,
//! deepspeed, mpirun). How each is recognised and where its options end is
//! `command`'s job; a tool that starts its own ranks tells its size through
//! its family (`Family::world`).

use std::ffi::OsString;

use crate::command::{Command, LauncherKind};
use crate::settings::World;

fn visible_devices(env: &dyn Fn(&str) -> Option<OsString>) -> Option<u64> {
    let v = env("CUDA_VISIBLE_DEVICES")?;
    let v = v.to_string_lossy();
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    Some(v.split(',').filter(|s| !s.trim().is_empty()).count() as u64)
}

/// The world size from the launchers' own options; one process without a launcher.
pub fn world_size(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> World {
    if cmd.launcher(LauncherKind::Torchrun).is_some() {
        return torchrun(cmd, env);
    }
    if cmd.launcher(LauncherKind::Accelerate).is_some() {
        return accelerate(cmd);
    }
    if cmd.launcher(LauncherKind::DeepSpeed).is_some() {
        return deepspeed(cmd, env);
    }
    mpirun(cmd).unwrap_or_else(|| World {
        size: 1,
        source: "single process (no distributed launcher)".into(),
        uncertain: false,
    })
}

/// `torchrun --nproc_per_node N|gpu|auto --nnodes M|MIN:MAX`.
fn torchrun(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> World {
    let t = LauncherKind::Torchrun;
    let (per_node, mut uncertain, mut source) = match cmd
        .launcher_value(t, &["--nproc_per_node", "--nproc-per-node"])
    {
        None => (1, false, "torchrun default --nproc_per_node 1".to_string()),
        Some(v) => match (v.parse::<u64>(), visible_devices(env)) {
            (Ok(n), _) => (n, false, format!("torchrun --nproc_per_node {n}")),
            (Err(_), Some(n)) => (
                n,
                false,
                format!("torchrun --nproc_per_node {v}: {n} GPUs in CUDA_VISIBLE_DEVICES"),
            ),
            (Err(_), None) => (
                1,
                true,
                format!(
                    "torchrun --nproc_per_node {v}: GPU count unknown here (set CUDA_VISIBLE_DEVICES); assuming 1"
                ),
            ),
        },
    };
    let nodes = match cmd.launcher_value(t, &["--nnodes"]) {
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
    World {
        size: per_node.saturating_mul(nodes),
        source,
        uncertain,
    }
}

/// `accelerate launch --num_processes N`; without it the accelerate config decides.
fn accelerate(cmd: &Command) -> World {
    match cmd
        .launcher_value(
            LauncherKind::Accelerate,
            &["--num_processes", "--num-processes"],
        )
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
    }
}

/// `deepspeed --num_gpus N --num_nodes M`; without `--num_gpus`, every visible GPU.
fn deepspeed(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> World {
    let d = LauncherKind::DeepSpeed;
    let nodes = cmd
        .launcher_value(d, &["--num_nodes", "--num-nodes"])
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    let gpus = cmd
        .launcher_value(d, &["--num_gpus", "--num-gpus"])
        .and_then(|v| v.parse::<u64>().ok());
    match (gpus, visible_devices(env)) {
        (Some(n), _) => World {
            size: n.saturating_mul(nodes),
            source: format!("deepspeed --num_gpus {n} × --num_nodes {nodes}"),
            uncertain: false,
        },
        (None, Some(n)) => World {
            size: n.saturating_mul(nodes),
            source: format!("deepspeed: {n} GPUs in CUDA_VISIBLE_DEVICES"),
            uncertain: false,
        },
        (None, None) => World {
            size: nodes,
            source: "deepspeed uses every visible GPU; count unknown here (set CUDA_VISIBLE_DEVICES or --num_gpus); assuming 1 per node".into(),
            uncertain: true,
        },
    }
}

/// `mpirun -np N` / `mpiexec -n N`.
fn mpirun(cmd: &Command) -> Option<World> {
    let l = cmd.launcher(LauncherKind::Mpirun)?;
    let n = cmd
        .launcher_value(LauncherKind::Mpirun, &["-np", "-n", "--np"])?
        .parse::<u64>()
        .ok()?;
    Some(World {
        size: n,
        source: format!("{} -np {n}", l.program),
        uncertain: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(cmd: &str, cvd: Option<&str>) -> World {
        let argv: Vec<OsString> = cmd.split_whitespace().map(OsString::from).collect();
        let cvd = cvd.map(OsString::from);
        world_size(&Command::parse(&argv), &move |k| {
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
