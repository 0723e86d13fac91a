//! Launchers: the world size from their own options (torchrun, accelerate,
//! deepspeed, mpirun). How each is recognised and where its options end is
//! `command`'s job; a tool that starts its own ranks tells its size through
//! its family (`Family::world`).

use std::ffi::OsString;

use crate::command::{Command, Launcher, LauncherKind};
use crate::settings::World;

/// What the environment closure answers, instead of a variable, with the
/// number of GPUs NVML sees when `CUDA_VISIBLE_DEVICES` is unset (`run_config`
/// asks the GPU probe; `OOMGUARD_FAKE_GPUS` in tests). No shell can set it.
pub const NVML_GPUS: &str = "oomguard:nvml-gpus";

fn visible_devices(env: &dyn Fn(&str) -> Option<OsString>) -> Option<u64> {
    let v = env("CUDA_VISIBLE_DEVICES")?;
    let v = v.to_string_lossy();
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    Some(v.split(',').filter(|s| !s.trim().is_empty()).count() as u64)
}

/// The GPUs the command's processes see, as a tool that starts one process per
/// GPU counts them (`torch.cuda.device_count()`): `CUDA_VISIBLE_DEVICES` when
/// set, else every GPU NVML sees. (count, where it comes from).
pub fn visible_gpus(env: &dyn Fn(&str) -> Option<OsString>) -> Option<(u64, String)> {
    if env("CUDA_VISIBLE_DEVICES").is_some() {
        return visible_devices(env).map(|n| (n, format!("{n} GPUs in CUDA_VISIBLE_DEVICES")));
    }
    let n = env(NVML_GPUS)?
        .to_string_lossy()
        .trim()
        .parse::<u64>()
        .ok()?;
    (n > 0).then(|| {
        (
            n,
            format!("{n} GPUs visible (NVML; CUDA_VISIBLE_DEVICES unset)"),
        )
    })
}

fn is_enabled(env: &dyn Fn(&str) -> Option<OsString>, name: &str) -> bool {
    env(name).is_some_and(|v| {
        matches!(
            v.to_string_lossy().trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "y" | "yes"
        )
    })
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
        accelerate(cmd, env)
    } else if cmd.launcher(LauncherKind::DeepSpeed).is_some() {
        deepspeed(cmd, env)
    } else {
        let wrapped = cmd
            .launchers
            .iter()
            .any(|l| matches!(l.kind, LauncherKind::Srun | LauncherKind::Mpirun));
        let world = match (wrapped, per_pod(env)) {
            (false, Some(p)) => World {
                size: p.world,
                source: p.source,
                uncertain: false,
            },
            (true, _) => World {
                size: 1,
                source: "1 process per task".into(),
                uncertain: false,
            },
            (false, None) => unseen(cmd, env).unwrap_or(World {
                size: 1,
                source: "single process (no distributed launcher)".into(),
                uncertain: false,
            }),
        };
        (world, 1)
    };
    with_tasks(cmd, env, inner, nodes)
}

/// A command that may start ranks where oomguard cannot see them: a tool's own GPU count
/// (detectron2's `--num-gpus 8`, `colossalai run --nproc_per_node 8`), a list of GPUs
/// (`device=0,1`, `--gpus 0,1,2,3`), or a shell script whose launcher is inside it
/// (`bash dist_train.sh cfg.py 8`). What it reads is a guess, said as such: the world is
/// uncertain (`plan` says to check the global batch), never a silent 1.
fn unseen(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> Option<World> {
    const COUNTS: &[&str] = &[
        "--num-gpus",
        "--num_gpus",
        "--ngpus",
        "--n_gpus",
        "--nproc_per_node",
        "--nproc-per-node",
        "--gpus",
    ];
    const LISTS: &[&str] = &["--gpus", "--device", "--devices", "--gpu_ids", "--gpu-ids"];
    let count = |v: &str| {
        v.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (2..=1 << 20).contains(n))
    };
    let list = |v: &str| {
        let ids: Vec<&str> = v.trim().trim_matches(['[', ']']).split(',').collect();
        (ids.len() > 1 && ids.iter().all(|i| i.trim().parse::<u32>().is_ok()))
            .then_some(ids.len() as u64)
    };
    let guess = |size: u64, what: String| World {
        size,
        source: format!(
            "{what}: a GPU count oomguard does not know as a launcher's, read as the world size"
        ),
        uncertain: true,
    };
    for name in COUNTS {
        if let Some(n) = cmd.value(&[name]).and_then(count) {
            return Some(guess(n, format!("{name} {n}")));
        }
    }
    for name in LISTS {
        if let Some(v) = cmd.value(&[name])
            && let Some(n) = list(v)
        {
            return Some(guess(n, format!("{name} {v}")));
        }
    }
    // Hydra overrides of a Lightning trainer (NeMo: `trainer.devices=8
    // trainer.num_nodes=8`) and fairseq's world.
    let nodes = cmd
        .override_value(&["trainer.num_nodes"])
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| (1..=1 << 16).contains(n))
        .unwrap_or(1);
    if let Some(v) = cmd.override_value(&["trainer.devices", "trainer.gpus"]) {
        // Lightning's own reading of `devices` (a count, a list, `auto`: the visible GPUs).
        let (per_node, _, said) = super::lightning::devices(v, false, env);
        let n = per_node.saturating_mul(nodes);
        if n > 1 {
            return Some(guess(n, format!("{said} × trainer.num_nodes {nodes}")));
        }
    }
    if let Some(v) = cmd.override_value(&["distributed_training.distributed_world_size"])
        && let Some(n) = count(v)
    {
        return Some(guess(
            n,
            format!("distributed_training.distributed_world_size={v}"),
        ));
    }
    for key in ["device", "devices", "gpus"] {
        if let Some(v) = cmd.override_value(&[key])
            && let Some(n) = list(v)
        {
            return Some(guess(n, format!("{key}={v}")));
        }
    }
    crate::inside::shell_script(cmd).map(|s| World {
        size: 1,
        source: format!(
            "{s} is a shell script: the launcher inside it, and the GPUs it starts, are not seen"
        ),
        uncertain: true,
    })
}

/// A program started once per pod by an operator that configures PyTorch
/// through the environment (the Kubeflow training operator's `WORLD_SIZE` and
/// `RANK` for a plain `python train.py`, `LOCAL_WORLD_SIZE` processes per pod,
/// default 1): the job's world, and this pod's place among the pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerPod {
    pub world: u64,
    /// This pod's index (`RANK / LOCAL_WORLD_SIZE`) and the pods' number.
    pub pod: u32,
    pub pods: u32,
    pub source: String,
}

/// [`PerPod`] from `WORLD_SIZE` > 1 and `RANK`, outside a Slurm step (whose
/// tasks are counted by Slurm's own variables).
pub fn per_pod(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PerPod> {
    let num = |name: &str| -> Option<u64> { env(name)?.to_str()?.trim().parse().ok() };
    if env("SLURM_PROCID").is_some() {
        return None;
    }
    let world = num("WORLD_SIZE").filter(|w| *w > 1)?;
    let rank = num("RANK").filter(|r| *r < world)?;
    let local = num("LOCAL_WORLD_SIZE")
        .filter(|l| *l >= 1 && world % *l == 0)
        .unwrap_or(1);
    let local_said = if local > 1 {
        format!(", LOCAL_WORLD_SIZE={local} per pod")
    } else {
        String::new()
    };
    Some(PerPod {
        world,
        pod: u32::try_from(rank / local).ok()?,
        pods: u32::try_from(world / local).ok()?,
        source: format!(
            "WORLD_SIZE={world} (RANK={rank}{local_said}: one program per pod, configured by the environment)"
        ),
    })
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

/// One of torchrun's options as torchrun reads it: from the command line, else
/// from `PET_<OPTION>` (torchrun's options all fall back to their
/// `PET_`-prefixed variable — `--nproc-per-node` to `PET_NPROC_PER_NODE` — which
/// is how the Kubeflow training operator, JobSet and Volcano configure it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchrunOpt {
    pub value: String,
    /// Where it was read: `--nnodes 2`, or `PET_NNODES=2`.
    pub from: String,
}

/// The variable torchrun reads an option from: `PET_` and the option's
/// name in capitals, `-` as `_` (argparse's `dest`).
pub fn pet_name(names: &[&str]) -> Option<String> {
    let long = names.iter().find(|n| n.starts_with("--"))?;
    Some(format!(
        "PET_{}",
        long.trim_start_matches('-')
            .replace('-', "_")
            .to_ascii_uppercase()
    ))
}

/// torchrun's option `names` (every spelling), command line first, as torchrun.
pub fn torchrun_opt(
    cmd: &Command,
    env: &dyn Fn(&str) -> Option<OsString>,
    names: &[&str],
) -> Option<TorchrunOpt> {
    let t = LauncherKind::Torchrun;
    cmd.launcher(t)?;
    if let Some(v) = cmd.launcher_value(t, names) {
        return Some(TorchrunOpt {
            value: v.to_string(),
            from: format!("{} {v}", names[0]),
        });
    }
    let var = pet_name(names)?;
    let v = env(&var)?.into_string().ok()?;
    let v = v.trim();
    (!v.is_empty()).then(|| TorchrunOpt {
        value: v.to_string(),
        from: format!("{var}={v}"),
    })
}

/// `torchrun --nproc_per_node N|gpu|auto --nnodes M|MIN:MAX` (or their `PET_` variables).
fn torchrun(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> (World, u64) {
    torchrun_rules(
        "torchrun",
        torchrun_opt(cmd, env, &["--nproc_per_node", "--nproc-per-node"]),
        torchrun_opt(cmd, env, &["--nnodes"]),
        env,
    )
}

/// torchrun's elastic range (`--nnodes MIN:MAX`, `PET_NNODES=MIN:MAX`): the world
/// sizes at its two ends, when the command is torchrun's and MIN < MAX.
pub fn elastic_range(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> Option<(u64, u64)> {
    let nnodes = torchrun_opt(cmd, env, &["--nnodes"])?;
    let (min, max) = min_max(&nnodes.value)?;
    if min >= max {
        return None;
    }
    let (w, nodes) = torchrun(cmd, env);
    let per_node = w.size / nodes.max(1);
    Some((per_node * min, per_node * max))
}

/// `MIN:MAX` (an elastic range), as torchrun splits it.
fn min_max(v: &str) -> Option<(u64, u64)> {
    let (a, b) = v.split_once(':')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// torchrun's own rules for its two options, however the command gives them
/// (`who` names where they came from: `torchrun`, `axolotl train --launcher torchrun --`).
fn torchrun_rules(
    who: &str,
    nproc: Option<TorchrunOpt>,
    nnodes: Option<TorchrunOpt>,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> (World, u64) {
    let (per_node, mut uncertain, mut source) = match &nproc {
        None => (1, false, format!("{who} default --nproc_per_node 1")),
        Some(o) => match (o.value.parse::<u64>(), visible_gpus(env)) {
            (Ok(n), _) => (n, false, format!("{who} {}", o.from)),
            (Err(_), Some((n, seen))) => (n, false, format!("{who} {}: {seen}", o.from)),
            (Err(_), None) => (
                1,
                true,
                format!(
                    "{who} {}: GPU count unknown here (set CUDA_VISIBLE_DEVICES); assuming 1",
                    o.from
                ),
            ),
        },
    };
    let nodes = match &nnodes {
        None => 1,
        Some(o) => match o.value.parse::<u64>() {
            Ok(n) => {
                source.push_str(&format!(" × {}", o.from));
                n
            }
            Err(_) => {
                // Elastic "MIN:MAX": the world size is not known before launch.
                // Sized for the fewest nodes: ZeRO and FSDP shard over the fewest
                // GPUs there, so each holds the most.
                let (min, max) = min_max(&o.value).unwrap_or((1, 1));
                let min = min.max(1);
                uncertain = true;
                source.push_str(&format!(
                    " × {} (elastic: {min} to {max} nodes, {} to {} processes; sized for the fewest)",
                    o.from,
                    per_node.saturating_mul(min),
                    per_node.saturating_mul(max)
                ));
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

/// `accelerate launch --num_processes N`; without it the accelerate config
/// decides (its `num_processes`, read with the config file); without a config,
/// accelerate starts one process per visible GPU.
fn accelerate(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> (World, u64) {
    let a = LauncherKind::Accelerate;
    let has_config = cmd
        .launcher_value(a, &["--config_file", "--config-file"])
        .is_some()
        || super::accelerate::default_config_in(env).is_some();
    let opts = AccelerateOpts {
        who: "accelerate launch",
        num_processes: cmd.launcher_value(a, &["--num_processes", "--num-processes"]),
        num_machines: cmd.launcher_value(a, &["--num_machines", "--num-machines"]),
        config: if has_config {
            AccelerateConfig::ReadElsewhere
        } else {
            AccelerateConfig::Absent
        },
    };
    accelerate_rules(&opts, env)
}

/// What decides how many processes `accelerate launch` starts.
struct AccelerateOpts<'a> {
    who: &'a str,
    num_processes: Option<&'a str>,
    num_machines: Option<&'a str>,
    config: AccelerateConfig,
}

/// Whether an accelerate config file applies, and what it says.
enum AccelerateConfig {
    /// None: accelerate counts the visible GPUs.
    Absent,
    /// One applies, read with the other config files (`Found::file_world`).
    ReadElsewhere,
    /// One applies, read here: its `num_processes`, `num_machines` and path.
    Read {
        processes: Option<u64>,
        machines: Option<u64>,
        name: String,
    },
}

/// accelerate's rules (`accelerate launch`'s `_validate_launch_command`): the
/// option, else the config file's `num_processes`, else (no config file) one
/// process per visible GPU. `num_processes` counts every machine's processes.
fn accelerate_rules(o: &AccelerateOpts, env: &dyn Fn(&str) -> Option<OsString>) -> (World, u64) {
    let who = o.who;
    let file_machines = match &o.config {
        AccelerateConfig::Read { machines, .. } => *machines,
        _ => None,
    };
    let machines = o
        .num_machines
        .and_then(|v| v.parse::<u64>().ok())
        .or(file_machines)
        .filter(|m| *m > 0)
        .unwrap_or(1);
    if let Some(n) = o.num_processes.and_then(|v| v.parse::<u64>().ok()) {
        let world = World {
            size: n,
            source: format!("{who} --num_processes {n}"),
            uncertain: false,
        };
        return (world, machines);
    }
    let world = match (&o.config, visible_gpus(env)) {
        (
            AccelerateConfig::Read {
                processes: Some(n),
                name,
                ..
            },
            _,
        ) if *n > 0 => World {
            size: *n,
            source: format!("{who}: accelerate config {name} num_processes: {n}"),
            uncertain: false,
        },
        (AccelerateConfig::ReadElsewhere | AccelerateConfig::Read { .. }, _) => World {
            size: 1,
            source: format!(
                "{who} without --num_processes (the accelerate config decides); assuming 1"
            ),
            uncertain: true,
        },
        (AccelerateConfig::Absent, Some((n, seen))) => World {
            size: n,
            source: format!(
                "{who} without --num_processes or an accelerate config: one process per GPU ({seen})"
            ),
            uncertain: false,
        },
        (AccelerateConfig::Absent, None) => World {
            size: 1,
            source: format!(
                "{who} without --num_processes or an accelerate config starts one process per visible GPU; count unknown here (set CUDA_VISIBLE_DEVICES); assuming 1"
            ),
            uncertain: true,
        },
    };
    (world, machines)
}

/// `axolotl train CONFIG [--launcher accelerate|torchrun|python] [-- LAUNCHER ARGS]`
/// (older releases: `--accelerate/--no-accelerate`): axolotl starts
/// `accelerate launch` by default, so accelerate's rules count the processes
/// (`--num-processes`, the launcher's own options after `--`, its config file,
/// else one per visible GPU); `--launcher torchrun` starts torchrun with the
/// options after `--` (one process per node unless they say more).
pub fn axolotl(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> Option<World> {
    if cmd.subcommand() != Some("train") {
        return None;
    }
    let start = cmd.args_start();
    let dashes = cmd.args[start..]
        .iter()
        .position(|a| a == "--")
        .map(|i| start + i);
    let own = start..dashes.unwrap_or(cmd.args.len());
    let passed = dashes.map(|d| d + 1..cmd.args.len()).unwrap_or(0..0);
    let launcher = cmd.value_in(own.clone(), &["--launcher"]);
    let python = launcher == Some("python") || cmd.has_flag(&["--no-accelerate"]);
    if python {
        return Some(World {
            size: 1,
            source: "axolotl train without a launcher (--launcher python): one process".into(),
            uncertain: false,
        });
    }
    if cmd.has_flag(&["--use-ray", "--use_ray"]) || launcher == Some("ray") {
        return Some(World {
            size: 1,
            source: "axolotl train on Ray: Ray starts the workers; count unknown here; assuming 1"
                .into(),
            uncertain: true,
        });
    }
    let legacy = cmd.value_in(own.clone(), &["--num-processes", "--num_processes"]);
    if launcher == Some("torchrun") {
        let nproc = cmd
            .value_in(passed.clone(), &["--nproc_per_node", "--nproc-per-node"])
            .or(legacy);
        let opt = |v: Option<&str>, name: &str| {
            v.map(|v| TorchrunOpt {
                value: v.to_string(),
                from: format!("{name} {v}"),
            })
        };
        let (w, _) = torchrun_rules(
            "axolotl train --launcher torchrun",
            opt(nproc, "--nproc_per_node"),
            opt(cmd.value_in(passed, &["--nnodes"]), "--nnodes"),
            env,
        );
        return Some(w);
    }
    let config_file = cmd
        .value_in(passed.clone(), &["--config_file", "--config-file"])
        .map(std::path::PathBuf::from)
        .or_else(|| super::accelerate::default_config_in(env));
    let config = match config_file {
        Some(p) => {
            let (processes, machines) = super::accelerate::processes_in(&p);
            AccelerateConfig::Read {
                processes,
                machines,
                name: p.display().to_string(),
            }
        }
        None => AccelerateConfig::Absent,
    };
    let opts = AccelerateOpts {
        who: "axolotl train (accelerate launch)",
        num_processes: cmd
            .value_in(passed.clone(), &["--num_processes", "--num-processes"])
            .or(legacy),
        num_machines: cmd.value_in(passed, &["--num_machines", "--num-machines"]),
        config,
    };
    Some(accelerate_rules(&opts, env).0)
}

/// `llamafactory-cli train` (`lmf train`): LLaMA-Factory starts `torchrun
/// --nnodes $NNODES --nproc_per_node $NPROC_PER_NODE` itself when
/// `FORCE_TORCHRUN` is set or more than one GPU is visible
/// (`NPROC_PER_NODE` defaults to the visible GPUs, `NNODES` to 1); else it
/// trains in one process. With `USE_RAY`, Ray starts the workers.
pub fn llamafactory(cmd: &Command, env: &dyn Fn(&str) -> Option<OsString>) -> Option<World> {
    if cmd.subcommand() != Some("train") {
        return None;
    }
    let tool = "llamafactory-cli train";
    if is_enabled(env, "USE_RAY") {
        return Some(World {
            size: 1,
            source: format!(
                "{tool} with USE_RAY: Ray starts the workers; count unknown here; assuming 1"
            ),
            uncertain: true,
        });
    }
    let var = |name: &str| {
        env(name)
            .map(|v| v.to_string_lossy().trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let gpus = visible_gpus(env);
    let forced = is_enabled(env, "FORCE_TORCHRUN");
    let many = gpus.as_ref().is_some_and(|(n, _)| *n > 1);
    if !forced && !many {
        return Some(match gpus {
            Some((_, seen)) => World {
                size: 1,
                source: format!("{tool}: one process ({seen}, FORCE_TORCHRUN unset)"),
                uncertain: false,
            },
            None => World {
                size: 1,
                source: format!(
                    "{tool} starts torchrun with one process per GPU when more than one is visible; GPU count unknown here (set CUDA_VISIBLE_DEVICES); assuming 1"
                ),
                uncertain: true,
            },
        });
    }
    let why = if forced {
        "FORCE_TORCHRUN set"
    } else {
        "more than one GPU visible"
    };
    let (per_node, mut uncertain, mut source) = match (var("NPROC_PER_NODE"), &gpus) {
        (Some(v), _) => match v.parse::<u64>() {
            Ok(n) if n > 0 => (
                n,
                false,
                format!("{tool} starts torchrun ({why}): NPROC_PER_NODE={n}"),
            ),
            _ => (
                1,
                true,
                format!(
                    "{tool} starts torchrun ({why}): NPROC_PER_NODE={v} is not a count; assuming 1"
                ),
            ),
        },
        (None, Some((n, seen))) => (
            *n,
            false,
            format!("{tool} starts torchrun ({why}): one process per GPU, {seen}"),
        ),
        (None, None) => (
            1,
            true,
            format!(
                "{tool} starts torchrun ({why}) with one process per GPU; GPU count unknown here (set CUDA_VISIBLE_DEVICES or NPROC_PER_NODE); assuming 1"
            ),
        ),
    };
    let nodes = match var("NNODES") {
        None => 1,
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => {
                source.push_str(&format!(" × NNODES={n}"));
                n
            }
            _ => {
                uncertain = true;
                source.push_str(&format!(" × NNODES={v} (not a count; assuming 1)"));
                1
            }
        },
    };
    Some(World {
        size: per_node.saturating_mul(nodes),
        source,
        uncertain,
    })
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
    let world = match (gpus, visible_gpus(env)) {
        (Some(n), _) => World {
            size: n.saturating_mul(nodes),
            source: format!("deepspeed --num_gpus {n} × --num_nodes {nodes}"),
            uncertain: false,
        },
        (None, Some((n, seen))) => World {
            size: n.saturating_mul(nodes),
            source: format!("deepspeed: {seen}"),
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

    /// A launcher oomguard does not know, a list of GPUs, Hydra's trainer overrides and a
    /// shell script: the world is read where it can be, and uncertain; a plain script
    /// stays one certain process. (Published commands: detectron2's train_net.py,
    /// colossalai run, Ultralytics, NeMo, fairseq-hydra-train, timm's
    /// distributed_train.sh.)
    #[test]
    fn a_launcher_oomguard_does_not_know_gives_an_uncertain_world_never_a_silent_one() {
        for (cmd, size) in [
            ("python train_net.py --config-file c.yaml --num-gpus 8", 8),
            (
                "colossalai run --nproc_per_node 8 --hostfile h train.py --batch_size 4",
                8,
            ),
            (
                "yolo detect train data=coco8.yaml model=yolov8n.pt device=0,1",
                2,
            ),
            ("python train.py --gpus 0,1,2,3 --batch-size 64", 4),
            (
                "python train.py trainer.devices=8 trainer.num_nodes=8 ++model.micro_batch_size=1",
                64,
            ),
            (
                "fairseq-hydra-train task.data=d distributed_training.distributed_world_size=8",
                8,
            ),
            (
                "./distributed_train.sh 4 --model resnet50 --batch-size 256",
                1,
            ),
            ("bash tools/dist_train.sh configs/r50.py 8", 1),
        ] {
            let w = ws(cmd, None);
            assert_eq!((w.size, w.uncertain), (size, true), "{cmd}: {}", w.source);
        }
        for cmd in [
            "python train.py --per_device_train_batch_size 8",
            "python train.py --num-gpus 1 --batch-size 8",
            "python train.py --device 0",
        ] {
            let w = ws(cmd, None);
            assert_eq!((w.size, w.uncertain), (1, false), "{cmd}: {}", w.source);
        }
    }

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
    fn pet_variables_as_torchrun_reads_them() {
        assert_eq!(
            pet_name(&["--nproc-per-node", "--nproc_per_node"]).as_deref(),
            Some("PET_NPROC_PER_NODE")
        );
        assert_eq!(
            pet_name(&["--node_rank", "--node-rank"]).as_deref(),
            Some("PET_NODE_RANK")
        );
        let pet = [("PET_NNODES", "2"), ("PET_NPROC_PER_NODE", "4")];
        let w = ws_env("torchrun t.py", &pet);
        assert_eq!(
            (w.size, w.source.as_str()),
            (8, "torchrun PET_NPROC_PER_NODE=4 × PET_NNODES=2")
        );
        // The command line wins, option by option; `gpu` from the environment
        // counts the visible GPUs; an empty variable is no value.
        assert_eq!(ws_env("torchrun --nnodes 3 t.py", &pet).size, 12);
        let w = ws_env(
            "torchrun t.py",
            &[
                ("PET_NPROC_PER_NODE", "gpu"),
                ("CUDA_VISIBLE_DEVICES", "0,1"),
            ],
        );
        assert_eq!(w.size, 2);
        assert_eq!(ws_env("torchrun t.py", &[("PET_NNODES", "")]).size, 1);
        // Not torchrun's: a plain script ignores PET_*, and reads WORLD_SIZE per pod.
        assert_eq!(ws_env("python3 t.py", &pet).size, 1);
        let w = ws_env("python3 t.py", &[("WORLD_SIZE", "4"), ("RANK", "2")]);
        assert_eq!(w.size, 4);
        let env = |k: &str| match k {
            "WORLD_SIZE" => Some(OsString::from("8")),
            "RANK" => Some(OsString::from("5")),
            "LOCAL_WORLD_SIZE" => Some(OsString::from("4")),
            _ => None,
        };
        let p = per_pod(&env).unwrap();
        assert_eq!((p.world, p.pod, p.pods), (8, 1, 2));
        // Inside a Slurm step, Slurm counts the tasks.
        let w = ws_env(
            "python3 t.py",
            &[("WORLD_SIZE", "4"), ("RANK", "2"), ("SLURM_PROCID", "2")],
        );
        assert_eq!(w.size, 1);
        let elastic = [("PET_NNODES", "1:4"), ("PET_NPROC_PER_NODE", "2")];
        let argv: Vec<OsString> = ["torchrun", "t.py"].iter().map(OsString::from).collect();
        let env = |k: &str| {
            elastic
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        };
        assert_eq!(elastic_range(&Command::parse(&argv), &env), Some((2, 8)));
    }

    #[test]
    fn script_flags_do_not_count() {
        // --nproc_per_node after the script belongs to the script.
        assert_eq!(ws("torchrun t.py --nproc_per_node 4", None).size, 1);
    }

    /// The world size of a tool that starts its own ranks, through the registry.
    fn tool(cmd: &str, vars: &[(&str, &str)]) -> (u64, bool, String) {
        let argv: Vec<OsString> = cmd.split_whitespace().map(OsString::from).collect();
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |k: &str| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| OsString::from(v))
        };
        let ctx = crate::frameworks::Ctx {
            recipe_output_dir: None,
            recipe_value: &|_| None,
        };
        let w = crate::frameworks::world(&Command::parse(&argv), &env, &ctx);
        (w.size, w.uncertain, w.source)
    }

    /// Megatron's tensor, pipeline and context parallelism split one model over ranks that
    /// see the same batch: the world for a batch is the data-parallel ranks (Megatron-LM's
    /// GPT-3 175B script: 8 × 16 nodes, tensor 8 × pipeline 16 = 1 data-parallel rank).
    #[test]
    fn megatrons_model_parallel_ranks_are_not_data_parallel_ranks() {
        let gpt = "torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --micro-batch-size 1 --global-batch-size 1536";
        let (size, _, source) = tool(gpt, &[]);
        assert_eq!(size, 1, "{source}");
        assert!(
            source.contains("128 ranks") && source.contains("tensor 8 × pipeline 16"),
            "{source}"
        );
        let tp2 = "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 1";
        assert_eq!(tool(tp2, &[]).0, 2);
        // No model parallelism, or a split that does not divide the world: as launched.
        assert_eq!(
            tool(
                "torchrun --nproc_per_node 8 pretrain_gpt.py --micro-batch-size 4",
                &[]
            )
            .0,
            8
        );
        assert_eq!(
            tool(
                "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 3",
                &[]
            )
            .0,
            8
        );
    }

    #[test]
    fn llamafactory_starts_torchrun_by_its_own_rules() {
        let lf = "llamafactory-cli train sft.yaml";
        let two = [("CUDA_VISIBLE_DEVICES", "0,1")];
        assert_eq!(tool(lf, &two).0, 2, "{:?}", tool(lf, &two));
        let one = [("CUDA_VISIBLE_DEVICES", "0")];
        let w = tool(lf, &one);
        assert_eq!((w.0, w.1), (1, false), "{}", w.2);
        // No GPU count known and nothing forced: said, not guessed silently.
        assert!(tool(lf, &[]).1);
        let forced = [("FORCE_TORCHRUN", "1"), ("NPROC_PER_NODE", "4")];
        assert_eq!(tool(lf, &forced).0, 4);
        let nodes = [
            ("FORCE_TORCHRUN", "true"),
            ("NPROC_PER_NODE", "8"),
            ("NNODES", "2"),
        ];
        assert_eq!(tool(lf, &nodes).0, 16);
        // FORCE_TORCHRUN with the default NPROC_PER_NODE: every visible GPU,
        // from NVML when CUDA_VISIBLE_DEVICES is unset.
        let nvml = [("FORCE_TORCHRUN", "1"), (NVML_GPUS, "8")];
        assert_eq!(tool(lf, &nvml).0, 8, "{:?}", tool(lf, &nvml));
        assert_eq!(tool("lmf train sft.yaml", &two).0, 2);
        // Not training: no ranks.
        assert_eq!(tool("llamafactory-cli chat sft.yaml", &two).0, 1);
    }

    #[test]
    fn axolotl_train_counts_by_accelerate_or_torchrun_rules() {
        let cvd = [("CUDA_VISIBLE_DEVICES", "0,1,2")];
        assert_eq!(tool("axolotl train c.yml", &cvd).0, 3);
        assert_eq!(tool("axolotl train c.yml --num-processes 2", &cvd).0, 2);
        assert_eq!(tool("axolotl train c.yml -- --num_processes 2", &cvd).0, 2);
        assert_eq!(
            tool(
                "axolotl train c.yml --launcher torchrun -- --nproc_per_node 4 --nnodes 2",
                &cvd
            )
            .0,
            8
        );
        assert_eq!(tool("axolotl train c.yml --launcher torchrun", &cvd).0, 1);
        assert_eq!(tool("axolotl train c.yml --launcher python", &cvd).0, 1);
        assert_eq!(tool("axolotl train c.yml --no-accelerate", &cvd).0, 1);
        assert!(tool("axolotl train c.yml", &[]).1);
    }

    #[test]
    fn accelerate_without_a_config_starts_one_process_per_gpu() {
        let w = ws("accelerate launch t.py", Some("0,1"));
        assert_eq!(size(&w), (2, false), "{}", w.source);
        let w = ws_env("accelerate launch t.py", &[(NVML_GPUS, "4")]);
        assert_eq!(size(&w), (4, false), "{}", w.source);
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
