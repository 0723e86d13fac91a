//! Launchers: the world size from their own options (torchrun, accelerate,
//! deepspeed, mpirun). How each is recognised and where its options end is
//! `command`'s job; a tool that starts its own ranks tells its size through
//! its family (`Family::world`).

use std::ffi::OsString;

use crate::command::{Command, Launcher, LauncherKind};
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
///
/// A launcher that starts tasks (`srun`, `mpirun`) multiplies what each task
/// runs: `srun -n2 python` is 2, `srun -N2 --ntasks-per-node=1 torchrun
/// --nnodes 2 --nproc_per_node 4` is 2 tasks × 4 = 8 (each task is one of
/// torchrun's nodes, so its `--nnodes` is not counted twice).
pub fn world_size(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> World {
    let (inner, nodes) = if cmd.launcher(LauncherKind::Torchrun).is_some() {
        torchrun(cmd, env)
    } else if cmd.launcher(LauncherKind::Accelerate).is_some() {
        accelerate(cmd)
    } else if cmd.launcher(LauncherKind::DeepSpeed).is_some() {
        deepspeed(cmd, env)
    } else {
        let wrapped = cmd
            .launchers
            .iter()
            .any(|l| matches!(l.kind, LauncherKind::Srun | LauncherKind::Mpirun));
        let world = World {
            size: 1,
            source: if wrapped {
                "1 process per task".into()
            } else {
                "single process (no distributed launcher)".into()
            },
            uncertain: false,
        };
        (world, 1)
    };
    with_tasks(cmd, env, inner, nodes)
}

/// The tasks one task-starting launcher (`srun`, `mpirun`) starts.
struct Tasks {
    count: u64,
    source: String,
    uncertain: bool,
}

/// `inner` (what one task runs, spread over `nodes` tasks when the inner
/// launcher is itself multi-node) times the tasks of every `srun` / `mpirun`
/// around it. A family's own world size (`tune run`, `litgpt`) goes through
/// here too, with `nodes` 1.
pub fn with_tasks(
    cmd: &Command,
    env: &dyn Fn(&str) -> Option<OsString>,
    inner: World,
    nodes: u64,
) -> World {
    let outer: Vec<Tasks> = cmd
        .launchers
        .iter()
        .filter_map(|l| match l.kind {
            LauncherKind::Srun => Some(srun(cmd, l, env)),
            LauncherKind::Mpirun => Some(mpirun(cmd, l)),
            _ => None,
        })
        .collect();
    if outer.is_empty() {
        return inner;
    }
    let tasks = outer.iter().fold(1u64, |n, t| n.saturating_mul(t.count));
    let mut uncertain = inner.uncertain || outer.iter().any(|t| t.uncertain);
    let names: Vec<&str> = outer.iter().map(|t| t.source.as_str()).collect();
    let mut source = names.join(" × ");
    let per_task = if nodes <= 1 {
        inner.size
    } else {
        let per_node = inner.size / nodes;
        if nodes != tasks {
            uncertain = true;
            source.push_str(&format!(
                " (the inner launcher expects {nodes} nodes but {tasks} tasks are started)"
            ));
        }
        per_node.max(1)
    };
    let size = tasks.saturating_mul(per_task);
    source.push_str(&format!(
        " × {per_task} per task ({}) = {size}",
        inner.source
    ));
    World {
        size,
        source,
        uncertain,
    }
}

/// A task or node count: `4`, or a Slurm range `2-4` (its minimum, uncertain).
fn count(v: &str) -> Option<(u64, bool)> {
    if let Ok(n) = v.trim().parse::<u64>() {
        return (n > 0).then_some((n, false));
    }
    let (min, _) = v.split_once('-')?;
    let n = min.trim().parse::<u64>().ok()?;
    (n > 0).then_some((n, true))
}

/// `srun -n/--ntasks`, `--ntasks-per-node` × `-N/--nodes`, `-N` alone (one task
/// per node); each also from `SLURM_NTASKS`, `SLURM_NTASKS_PER_NODE`,
/// `SLURM_NNODES` inside an allocation, which srun reads as those options. An
/// option on the command line wins over the environment, as in srun.
fn srun(cmd: &Command, l: &Launcher, env: &dyn Fn(&str) -> Option<OsString>) -> Tasks {
    let opt = |short: &[&str], long: &[&str], var: &str| -> Option<(String, String)> {
        if let Some(v) = cmd.launcher_option(l, short, long) {
            let name = long.first().copied().unwrap_or("");
            return Some((v.to_string(), format!("{name} {v}")));
        }
        let v = env(var)?;
        let v = v.to_string_lossy().trim().to_string();
        (!v.is_empty()).then(|| (v.clone(), format!("{var}={v}")))
    };
    let bad = |what: String| Tasks {
        count: 1,
        source: format!("srun {what}: not a task count; assuming 1 task"),
        uncertain: true,
    };
    let ntasks = opt(&["-n"], &["--ntasks"], "SLURM_NTASKS");
    let per_node = opt(&[], &["--ntasks-per-node"], "SLURM_NTASKS_PER_NODE");
    let nodes = opt(&["-N"], &["--nodes"], "SLURM_NNODES");
    if let Some((v, src)) = ntasks {
        return match count(&v) {
            Some((n, unsure)) => Tasks {
                count: n,
                source: format!("srun {src}"),
                uncertain: unsure,
            },
            None => bad(src),
        };
    }
    let nodes = match nodes {
        None => None,
        Some((v, src)) => match count(&v) {
            Some((n, unsure)) => Some((n, unsure, src)),
            None => return bad(src),
        },
    };
    match (per_node, nodes) {
        (Some((v, src)), nodes) => {
            let Some((p, unsure)) = count(&v) else {
                // SLURM_NTASKS_PER_NODE can be "2(x3),1": uneven nodes.
                return bad(src);
            };
            let (n, n_unsure, n_src) = nodes.unwrap_or((1, false, "1 node".into()));
            Tasks {
                count: p.saturating_mul(n),
                source: format!("srun {src} × {n_src}"),
                uncertain: unsure || n_unsure,
            }
        }
        (None, Some((n, unsure, src))) => Tasks {
            count: n,
            source: format!("srun {src} (one task per node)"),
            uncertain: unsure,
        },
        (None, None) => Tasks {
            count: 1,
            source: "srun without -n/-N (1 task)".into(),
            uncertain: false,
        },
    }
}

/// `mpirun -np N` / `--np N` / `-n N` / `mpiexec -n N`; without one, mpirun
/// fills every slot it knows of, which is not known here.
fn mpirun(cmd: &Command, l: &Launcher) -> Tasks {
    let v = cmd.launcher_option(l, &["-n"], &["-np", "--np", "--n", "-c"]);
    match v.and_then(count) {
        Some((n, _)) => Tasks {
            count: n,
            source: format!("{} -np {n}", l.program),
            uncertain: false,
        },
        None => Tasks {
            count: 1,
            source: format!(
                "{} without -np (one process per slot; count unknown here); assuming 1",
                l.program
            ),
            uncertain: true,
        },
    }
}

/// `torchrun --nproc_per_node N|gpu|auto --nnodes M|MIN:MAX`.
fn torchrun(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> (World, u64) {
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
    let world = World {
        size: per_node.saturating_mul(nodes),
        source,
        uncertain,
    };
    (world, nodes)
}

/// `accelerate launch --num_processes N`; without it the accelerate config decides.
fn accelerate(cmd: &Command) -> (World, u64) {
    let machines = cmd
        .launcher_value(
            LauncherKind::Accelerate,
            &["--num_machines", "--num-machines"],
        )
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    let world = match cmd
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
    };
    (world, machines)
}

/// `deepspeed --num_gpus N --num_nodes M`; without `--num_gpus`, every visible GPU.
fn deepspeed(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> (World, u64) {
    let d = LauncherKind::DeepSpeed;
    let nodes = cmd
        .launcher_value(d, &["--num_nodes", "--num-nodes"])
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    let gpus = cmd
        .launcher_value(d, &["--num_gpus", "--num-gpus"])
        .and_then(|v| v.parse::<u64>().ok());
    let world = match (gpus, visible_devices(env)) {
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
    };
    (world, nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(cmd: &str, cvd: Option<&str>) -> World {
        match cvd {
            Some(v) => ws_env(cmd, &[("CUDA_VISIBLE_DEVICES", v)]),
            None => ws_env(cmd, &[]),
        }
    }

    fn ws_env(cmd: &str, vars: &[(&str, &str)]) -> World {
        let argv: Vec<OsString> = cmd.split_whitespace().map(OsString::from).collect();
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        world_size(&Command::parse(&argv), &move |k| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| OsString::from(v))
        })
    }

    fn size(w: &World) -> (u64, bool) {
        (w.size, w.uncertain)
    }

    #[test]
    fn srun_task_counts() {
        for (cmd, n) in [
            ("srun -n2 python3 t.py", 2),
            ("srun -n 2 python3 t.py", 2),
            ("srun --ntasks=2 python3 t.py", 2),
            ("srun --ntasks 3 python3 t.py", 3),
            ("srun -N2 --ntasks-per-node=4 python3 t.py", 8),
            ("srun -N 2 --ntasks-per-node 4 python3 t.py", 8),
            ("srun --nodes=2 python3 t.py", 2),
            ("srun -N2 -n2 python3 t.py", 2),
            ("srun -l -u -n4 --mpi=pmix python3 t.py", 4),
            ("srun python3 t.py", 1),
        ] {
            assert_eq!(size(&ws(cmd, None)), (n, false), "{cmd}");
        }
    }

    #[test]
    fn srun_inside_an_allocation() {
        let w = ws_env("srun python3 t.py", &[("SLURM_NTASKS", "2")]);
        assert_eq!(size(&w), (2, false));
        assert!(w.source.contains("SLURM_NTASKS=2"), "{}", w.source);
        let w = ws_env(
            "srun python3 t.py",
            &[("SLURM_NNODES", "2"), ("SLURM_NTASKS_PER_NODE", "4")],
        );
        assert_eq!(size(&w), (8, false));
        // The command line wins over the allocation's environment.
        let w = ws_env("srun -n1 python3 t.py", &[("SLURM_NTASKS", "8")]);
        assert_eq!(size(&w), (1, false));
        // Uneven tasks per node cannot be read: said, not guessed silently.
        let w = ws_env("srun python3 t.py", &[("SLURM_NTASKS_PER_NODE", "2(x3),1")]);
        assert!(w.uncertain, "{w:?}");
        assert!(w.source.contains("2(x3),1"), "{}", w.source);
        // A node range is uncertain, at its minimum.
        let w = ws("srun -N 2-4 python3 t.py", None);
        assert_eq!(size(&w), (2, true));
    }

    #[test]
    fn launcher_inside_srun() {
        let w = ws(
            "srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc_per_node 4 t.py",
            None,
        );
        assert_eq!(size(&w), (8, false), "{}", w.source);
        let w = ws("srun -n2 torchrun --nproc_per_node 4 t.py", None);
        assert_eq!(size(&w), (8, false), "{}", w.source);
        // torchrun expects 2 nodes but srun starts 3 tasks: said.
        let w = ws("srun -n3 torchrun --nnodes 2 --nproc_per_node 4 t.py", None);
        assert_eq!(size(&w), (12, true), "{}", w.source);
        assert!(w.source.contains("expects 2 nodes"), "{}", w.source);
        let w = ws("srun -N2 deepspeed --num_gpus 8 --num_nodes 2 t.py", None);
        assert_eq!(size(&w), (16, false), "{}", w.source);
        let w = ws(
            "srun -N2 accelerate launch --num_processes 8 --num_machines 2 t.py",
            None,
        );
        assert_eq!(size(&w), (8, false), "{}", w.source);
        let w = ws("srun -n2 oomguard python3 t.py", None);
        assert_eq!(size(&w), (2, false), "{}", w.source);
    }

    #[test]
    fn mpirun_counts() {
        for cmd in [
            "mpirun --np 2 python3 t.py",
            "mpirun -np 2 python3 t.py",
            "mpirun -n 2 python3 t.py",
            "mpiexec -n 2 ./train",
            "mpirun --np=2 --allow-run-as-root python t.py",
        ] {
            assert_eq!(size(&ws(cmd, None)), (2, false), "{cmd}");
        }
        let w = ws("mpirun python3 t.py", None);
        assert_eq!(size(&w), (1, true), "{}", w.source);
        assert_eq!(
            size(&ws("mpirun -np 2 torchrun --nproc_per_node 4 t.py", None)),
            (8, false)
        );
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
        assert_eq!(ws("srun -n8 ./train", None).size, 8);
        assert_eq!(ws("python train.py", None).size, 1);
    }
}
