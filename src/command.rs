//! The user's argv, parsed once: the launchers and their own options, the
//! training script (or module, or tool), every flag occurrence and every
//! `key=value` override. Every stage reads this; none re-scans argv.
//!
//! Theory of operation: a command is a chain of programs. Launchers that run
//! another program (`srun`, `mpirun`) are followed to the program they run;
//! launchers that run Python code (`torchrun`, `accelerate launch`,
//! `deepspeed`, `python -m torch.distributed.run`, `python`) end at the
//! script or `-m` module. A launcher's own options end at the first
//! positional argument that is not the value of one of them; whether an
//! option takes a value is read from the launcher's list of switches (options
//! that never take one), so `torchrun --nproc_per_node 4 train.py` ends at
//! `train.py` and `torchrun --standalone train.py` does too. Anything else
//! (`axolotl`, `tune`, `./run.sh`) is a tool: its
//! arguments start right after its name.

use std::ffi::OsString;
use std::ops::Range;
use std::path::Path;

/// A program that starts the training program (and is not it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LauncherKind {
    /// `torchrun`, `python -m torch.distributed.run` / `.launch`.
    Torchrun,
    /// `accelerate launch`, `python -m accelerate.commands.launch`.
    Accelerate,
    /// The `deepspeed` launcher.
    DeepSpeed,
    /// `mpirun`, `mpiexec`.
    Mpirun,
    /// Slurm's `srun`.
    Srun,
    /// A Python interpreter running a script or `-m` module.
    Python,
}

impl LauncherKind {
    /// Options of this launcher that never take a value.
    fn switches(self) -> &'static [&'static str] {
        match self {
            LauncherKind::Torchrun => &[
                "--standalone",
                "--no-python",
                "--no_python",
                "--run-path",
                "--run_path",
                "--module",
                "-m",
            ],
            LauncherKind::Accelerate => &[
                "--cpu",
                "--multi_gpu",
                "--multi-gpu",
                "--tpu",
                "--ipex",
                "--use_deepspeed",
                "--use-deepspeed",
                "--use_fsdp",
                "--use-fsdp",
                "--use_megatron_lm",
                "--use_xpu",
                "--module",
                "-m",
                "--no_python",
                "--no-python",
                "--debug",
                "--quiet",
                "-q",
                "--same_network",
                "--same-network",
                "--deepspeed_moe_layer_cls_names",
                "--dynamo_use_fullgraph",
                "--dynamo_use_dynamic",
                "--downcast_bf16",
                "--enable_cpu_affinity",
            ],
            LauncherKind::DeepSpeed => &[
                "--no_python",
                "--no-python",
                "--no_local_rank",
                "--no-local-rank",
                "--no_ssh_check",
                "--no_ssh",
                "--force_multi",
                "--save_pid",
                "--enable_each_rank_log",
                "--bind_cores_to_rank",
                "--module",
                "-m",
                "--elastic_training",
            ],
            LauncherKind::Mpirun => &[
                "--allow-run-as-root",
                "--oversubscribe",
                "--tag-output",
                "--timestamp-output",
                "--report-bindings",
                "-q",
                "--quiet",
                "-v",
                "--verbose",
            ],
            LauncherKind::Srun => &[
                "--exclusive",
                "--overlap",
                "--unbuffered",
                "-u",
                "-l",
                "--label",
                "-Q",
                "--quiet",
                "-v",
                "--verbose",
                "-k",
                "--no-kill",
                "-K",
                "--kill-on-bad-exit",
                "--pty",
                "-X",
                "--disable-status",
                "-Z",
                "--no-allocate",
            ],
            // -u, -O, -B ...: single letters; only -W, -X, -c, -m take a value.
            LauncherKind::Python => &[],
        }
    }

    /// Options of a launcher that runs another program which always take a
    /// value, even one that looks like a program (`srun -o logs/%t.out`,
    /// `-D /scratch/run`).
    fn valued(self) -> &'static [&'static str] {
        match self {
            LauncherKind::Srun => &[
                "-o",
                "--output",
                "-e",
                "--error",
                "-i",
                "--input",
                "-D",
                "--chdir",
                "-J",
                "--job-name",
                "-p",
                "--partition",
                "-w",
                "--nodelist",
                "-x",
                "--exclude",
                "-A",
                "--account",
                "-t",
                "--time",
                "-n",
                "--ntasks",
                "-N",
                "--nodes",
                "-c",
                "--cpus-per-task",
                "-G",
                "--gpus",
                "--gres",
                "--mem",
                "--export",
                "--mpi",
                "--container-image",
                "--container-mounts",
            ],
            LauncherKind::Mpirun => &[
                "-np",
                "-n",
                "--np",
                "-H",
                "--host",
                "-hostfile",
                "--hostfile",
                "-x",
                "-wdir",
                "--wdir",
                "-mca",
                "--mca",
                "--map-by",
                "--bind-to",
            ],
            _ => &[],
        }
    }

    /// A launcher that runs a Python script or module (not another program).
    fn runs_python(self) -> bool {
        !matches!(self, LauncherKind::Mpirun | LauncherKind::Srun)
    }
}

/// One launcher in the command and the argv positions of its own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    pub kind: LauncherKind,
    /// The launcher's program name as written (`torchrun`, `python3`).
    pub program: String,
    /// argv indices of its options (after its name and subcommand).
    pub opts: Range<usize>,
}

/// What the launchers finally run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Python file (`train.py`), at this argv index.
    Script { index: usize },
    /// `-m MODULE`: the module name at this argv index.
    Module { index: usize },
    /// A program that is not a launcher (`axolotl`, `tune`, `./train`), at this index.
    Tool { index: usize },
    /// The launcher options ran to the end: nothing to run was found.
    Missing,
}

/// How a flag was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagForm {
    /// `--x 4`: the value is the next argv element.
    Space,
    /// `--x=4`
    Equals,
    /// `--x` alone (a boolean switched on).
    Bare,
}

/// One `--flag` occurrence in argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    pub name: String,
    /// Index of the flag itself.
    pub index: usize,
    pub form: FlagForm,
    pub value: Option<String>,
}

/// One `key=value` override (Hydra and OmegaConf dot-lists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// `+`, `++` or empty.
    pub prefix: String,
    pub key: String,
    pub value: String,
    pub index: usize,
}

/// The user's command, parsed once.
#[derive(Debug, Clone)]
pub struct Command {
    pub argv: Vec<OsString>,
    /// argv as text; a non-UTF-8 element is [`NOT_UTF8`], which matches no name.
    pub args: Vec<String>,
    /// Outermost first: `srun torchrun train.py` gives [srun, torchrun].
    pub launchers: Vec<Launcher>,
    pub target: Target,
    pub flags: Vec<Flag>,
    pub overrides: Vec<Override>,
}

/// Stands for a non-UTF-8 argv element in [`Command::args`] (argv cannot hold a NUL).
pub const NOT_UTF8: &str = "\0";

/// The file name of a program path (`/usr/bin/python3` → `python3`).
pub fn base_name(s: &str) -> &str {
    Path::new(s)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(s)
}

fn is_python(name: &str) -> bool {
    name == "python"
        || name
            .strip_prefix("python")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// `python -m MODULE` modules that are launchers themselves.
fn module_launcher(module: &str) -> Option<LauncherKind> {
    match module {
        "torch.distributed.run" | "torch.distributed.launch" => Some(LauncherKind::Torchrun),
        "accelerate.commands.launch" => Some(LauncherKind::Accelerate),
        "deepspeed.launcher.runner" => Some(LauncherKind::DeepSpeed),
        _ => None,
    }
}

fn is_short_flag(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2 && b[0] == b'-' && b[1].is_ascii_alphabetic()
}

/// Whether `s` is a program a wrapping launcher (srun, mpirun) would run,
/// rather than the value of its last option.
fn looks_like_program(s: &str) -> bool {
    let b = base_name(s);
    is_python(b)
        || matches!(
            b,
            "torchrun" | "accelerate" | "deepspeed" | "oomguard" | "bash" | "sh" | "env"
        )
        || s.contains('/')
        || s.ends_with(".py")
        || s.ends_with(".sh")
}

/// Where the options of a launcher starting at `start` end, and whether the
/// positional that ends them is a `-m` module name.
fn launcher_options_end(args: &[String], start: usize, kind: LauncherKind) -> (usize, bool) {
    let switches = kind.switches();
    let mut i = start;
    let mut module = false;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" {
            return (i + 1, module);
        }
        if !a.starts_with('-') || a == "-" {
            return (i, module);
        }
        if a == "-m" || a == "--module" {
            module = true;
            if kind == LauncherKind::Python {
                return (i + 1, true);
            }
            i += 1;
            continue;
        }
        if kind == LauncherKind::Python {
            // -W arg, -X opt, -c cmd take a value; every other letter is a switch.
            if matches!(a, "-W" | "-X" | "-c" | "--check-hash-based-pycs") {
                i += 2;
            } else {
                i += 1;
            }
            continue;
        }
        if a.contains('=') || switches.contains(&a) {
            i += 1;
            continue;
        }
        if kind.valued().contains(&a) {
            i += 2;
            continue;
        }
        // `--opt VALUE` unless the next element is itself an option, or the
        // program a wrapping launcher runs, or the script.
        let is_value = |next: &str| {
            let option = next.starts_with("--") || is_short_flag(next);
            let runs = if kind.runs_python() {
                next.ends_with(".py")
            } else {
                looks_like_program(next)
            };
            !option && !runs
        };
        match args.get(i + 1) {
            Some(next) if is_value(next) => i += 2,
            _ => i += 1,
        }
    }
    (args.len(), module)
}

impl Command {
    /// Parse `argv` (argv[0] is the program). An empty argv gives an empty command.
    pub fn parse(argv: &[OsString]) -> Command {
        let args: Vec<String> = argv
            .iter()
            .map(|a| a.to_str().unwrap_or(NOT_UTF8).to_string())
            .collect();
        let mut launchers = Vec::new();
        let mut i = 0;
        let target = loop {
            let Some(a) = args.get(i) else {
                break Target::Missing;
            };
            let name = base_name(a);
            let (kind, opts_start) = match name {
                "torchrun" => (LauncherKind::Torchrun, i + 1),
                "accelerate" if args.get(i + 1).map(String::as_str) == Some("launch") => {
                    (LauncherKind::Accelerate, i + 2)
                }
                "deepspeed" => (LauncherKind::DeepSpeed, i + 1),
                "mpirun" | "mpiexec" => (LauncherKind::Mpirun, i + 1),
                "srun" => (LauncherKind::Srun, i + 1),
                n if is_python(n) => (LauncherKind::Python, i + 1),
                _ => break Target::Tool { index: i },
            };
            let (end, module) = launcher_options_end(&args, opts_start, kind);
            // `python -m torch.distributed.run ...`: the module is a launcher.
            if kind == LauncherKind::Python
                && module
                && let Some(inner) = args.get(end).and_then(|m| module_launcher(m))
            {
                launchers.push(Launcher {
                    kind: LauncherKind::Python,
                    program: a.clone(),
                    opts: opts_start..end - 1,
                });
                let (end2, module2) = launcher_options_end(&args, end + 1, inner);
                launchers.push(Launcher {
                    kind: inner,
                    program: args[end].clone(),
                    opts: end + 1..end2,
                });
                break target_at(&args, end2, module2);
            }
            launchers.push(Launcher {
                kind,
                program: a.clone(),
                opts: opts_start..if module && kind == LauncherKind::Python {
                    end - 1
                } else {
                    end
                },
            });
            if kind.runs_python() {
                break target_at(&args, end, module);
            }
            // srun / mpirun run another program: follow it.
            i = end;
        };
        let flags = occurrences(&args);
        let first_arg = match target {
            Target::Script { index } | Target::Module { index } | Target::Tool { index } => {
                index + 1
            }
            Target::Missing => args.len(),
        };
        let overrides = args
            .iter()
            .enumerate()
            .skip(first_arg.max(1))
            .filter_map(|(index, a)| {
                let (prefix, key, value) = parse_override(a)?;
                Some(Override {
                    prefix,
                    key,
                    value,
                    index,
                })
            })
            .collect();
        Command {
            argv: argv.to_vec(),
            args,
            launchers,
            target,
            flags,
            overrides,
        }
    }

    /// The innermost launcher of this kind, if the command has one.
    pub fn launcher(&self, kind: LauncherKind) -> Option<&Launcher> {
        self.launchers.iter().rev().find(|l| l.kind == kind)
    }

    /// The tool's name when the launchers end at one (`axolotl`, `tune`), without its folder.
    pub fn tool(&self) -> Option<&str> {
        match self.target {
            Target::Tool { index } => Some(base_name(&self.args[index])),
            _ => None,
        }
    }

    /// The argument after the tool's name (`tune run`, `axolotl train`).
    pub fn subcommand(&self) -> Option<&str> {
        match self.target {
            Target::Tool { index } => self.args.get(index + 1).map(String::as_str),
            _ => None,
        }
    }

    /// The Python script the launchers run (`train.py`), as written.
    pub fn script(&self) -> Option<&str> {
        match self.target {
            Target::Script { index } => Some(&self.args[index]),
            _ => None,
        }
    }

    /// The `-m` module the launchers run (`axolotl.cli.train`).
    pub fn module(&self) -> Option<&str> {
        match self.target {
            Target::Module { index } => Some(&self.args[index]),
            _ => None,
        }
    }

    /// Index of the first argument of the script, module or tool (where launcher options end).
    pub fn args_start(&self) -> usize {
        match self.target {
            Target::Script { index } | Target::Module { index } | Target::Tool { index } => {
                index + 1
            }
            Target::Missing => self.args.len(),
        }
    }

    /// Index of the script, module or tool itself (`args_start() - 1`), or the end.
    pub fn target_index(&self) -> usize {
        self.args_start().saturating_sub(1)
    }

    /// Positional arguments of the script (not flags, not flag values, not overrides), with their indices.
    pub fn positionals(&self) -> impl Iterator<Item = (usize, &str)> {
        let values: Vec<usize> = self
            .flags
            .iter()
            .filter(|f| f.form == FlagForm::Space)
            .map(|f| f.index + 1)
            .collect();
        self.args
            .iter()
            .enumerate()
            .skip(self.args_start())
            .filter(move |(i, a)| {
                !a.starts_with('-') && !values.contains(i) && parse_override(a).is_none()
            })
            .map(|(i, a)| (i, a.as_str()))
    }

    /// A Python file given as a positional argument to a Python script
    /// (`train.py config/train_gpt2.py`): (index, path as written).
    pub fn python_config_module(&self) -> Option<(usize, &str)> {
        self.script()?;
        self.positionals().find(|(_, a)| a.ends_with(".py"))
    }

    /// Where the command names a value for which `is` holds — a flag's value, a
    /// positional argument, an override's value: (argv index, the text before the
    /// value in that element: `--x=`, `key=`, or nothing).
    pub fn find_value(&self, is: impl Fn(&str) -> bool) -> Option<(usize, String)> {
        for f in &self.flags {
            match (f.form, f.value.as_deref()) {
                (FlagForm::Space, Some(v)) if is(v) => return Some((f.index + 1, String::new())),
                (FlagForm::Equals, Some(v)) if is(v) => {
                    return Some((f.index, format!("{}=", f.name)));
                }
                _ => {}
            }
        }
        if let Some((i, _)) = self.positionals().find(|(_, a)| is(a)) {
            return Some((i, String::new()));
        }
        self.overrides
            .iter()
            .find(|o| is(&o.value))
            .map(|o| (o.index, format!("{}{}=", o.prefix, o.key)))
    }

    /// The last value of any of `names` among the flags at `region` indices.
    pub fn value_in(&self, region: Range<usize>, names: &[&str]) -> Option<&str> {
        self.flags
            .iter()
            .filter(|f| region.contains(&f.index) && names.contains(&f.name.as_str()))
            .filter_map(|f| f.value.as_deref())
            .next_back()
    }

    /// The last value of any of `names`, anywhere in the command.
    pub fn value(&self, names: &[&str]) -> Option<&str> {
        self.value_in(0..self.args.len(), names)
    }

    /// Whether any of `names` is given (with or without a value).
    pub fn has_flag(&self, names: &[&str]) -> bool {
        self.flags.iter().any(|f| names.contains(&f.name.as_str()))
    }

    /// The last `key=value` override for any of `keys` (also `+key=` / `++key=`).
    pub fn override_value(&self, keys: &[&str]) -> Option<&str> {
        self.overrides
            .iter()
            .filter(|o| keys.contains(&o.key.as_str()))
            .map(|o| o.value.as_str())
            .next_back()
    }

    /// The last value of a launcher's option, also in the forms a flag scan does not
    /// see: a short option with its number attached (`srun -n2`, `-N2`), and a
    /// value after a short option that looks like a flag itself. `short` are
    /// one-letter options (`-n`), `long` the others (`--ntasks`, `-np`).
    pub fn launcher_option(&self, l: &Launcher, short: &[&str], long: &[&str]) -> Option<&str> {
        let opts = &self.args[l.opts.clone()];
        let mut found = None;
        let mut i = 0;
        while i < opts.len() {
            let a = opts[i].as_str();
            let next = opts.get(i + 1).map(String::as_str);
            if short.contains(&a) || long.contains(&a) {
                if let Some(v) = next {
                    found = Some(v);
                    i += 1;
                }
            } else if let Some((name, v)) = a.split_once('=')
                && long.contains(&name)
            {
                found = Some(v);
            } else if let Some(v) = short.iter().find_map(|s| {
                a.strip_prefix(s)
                    .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            }) {
                found = Some(v);
            }
            i += 1;
        }
        found
    }

    /// The options of the innermost launcher of `kind`: the last value of any of `names`.
    pub fn launcher_value(&self, kind: LauncherKind, names: &[&str]) -> Option<&str> {
        let l = self.launcher(kind)?;
        self.value_in(l.opts.clone(), names)
    }
}

fn target_at(args: &[String], end: usize, module: bool) -> Target {
    match (args.get(end), module) {
        (None, _) => Target::Missing,
        (Some(_), true) => Target::Module { index: end },
        (Some(_), false) => Target::Script { index: end },
    }
}

/// Every `--flag` occurrence after argv[0]. A value is the next element when it
/// does not itself start with `--` or look like a short flag (so `-1` and
/// `1e-4` stay values).
fn occurrences(args: &[String]) -> Vec<Flag> {
    let mut out = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" || !a.starts_with('-') || a.len() == 1 {
            i += 1;
            continue;
        }
        if let Some((name, value)) = a.split_once('=') {
            out.push(Flag {
                name: name.to_string(),
                index: i,
                form: FlagForm::Equals,
                value: Some(value.to_string()),
            });
        } else {
            let next = args.get(i + 1).filter(|n| *n != NOT_UTF8);
            let takes = next.is_some_and(|n| !(n.starts_with("--") || is_short_flag(n)));
            out.push(Flag {
                name: a.to_string(),
                index: i,
                form: if takes {
                    FlagForm::Space
                } else {
                    FlagForm::Bare
                },
                value: if takes { next.cloned() } else { None },
            });
            if takes {
                i += 1;
            }
        }
        i += 1;
    }
    out
}

/// `key=value`, `+key=value` or `++key=value` → (prefix, key, value).
pub fn parse_override(token: &str) -> Option<(String, String, String)> {
    if token.starts_with('-') {
        return None;
    }
    let stripped = token.trim_start_matches('+');
    let prefix = token[..token.len() - stripped.len()].to_string();
    let (k, v) = stripped.split_once('=')?;
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-');
    ok.then(|| (prefix, k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(s: &str) -> Command {
        let argv: Vec<OsString> = s.split_whitespace().map(OsString::from).collect();
        Command::parse(&argv)
    }

    #[test]
    fn srun_option_values_that_look_like_programs() {
        let c = cmd("srun -n2 -o logs/%j-%t.out -D /scratch/run python3 train.py --x 1");
        assert_eq!(c.script(), Some("train.py"));
        let l = c.launcher(LauncherKind::Srun).unwrap();
        assert_eq!(
            c.launcher_option(l, &["-o"], &["--output"]),
            Some("logs/%j-%t.out")
        );
        assert_eq!(c.launcher_option(l, &["-n"], &["--ntasks"]), Some("2"));
        let c = cmd("mpirun --hostfile /etc/hosts -np 2 ./train");
        assert_eq!(c.tool(), Some("train"));
    }

    #[test]
    fn the_script_after_launcher_options_is_found_for_every_launcher() {
        for (line, script) in [
            ("python3 train.py --x 1", "train.py"),
            ("python -u train.py", "train.py"),
            (
                "torchrun --nproc_per_node=4 train.py --output_dir out",
                "train.py",
            ),
            ("torchrun --nproc_per_node 4 train.py", "train.py"),
            (
                "torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py",
                "train.py",
            ),
            (
                "python -m torch.distributed.run --nproc_per_node 2 my_train.py",
                "my_train.py",
            ),
            (
                "accelerate launch --config_file zero3.yaml train.py",
                "train.py",
            ),
            (
                "accelerate launch --multi_gpu --num_processes 2 sft.py",
                "sft.py",
            ),
            (
                "deepspeed --num_gpus 2 train.py --deepspeed ds.json",
                "train.py",
            ),
            (
                "srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 train.py",
                "train.py",
            ),
            ("srun --exclusive python train.py", "train.py"),
            ("mpirun -np 2 python train_gpt2.py", "train_gpt2.py"),
        ] {
            let c = cmd(line);
            assert_eq!(c.script(), Some(script), "{line}: {:?}", c.target);
        }
    }

    #[test]
    fn modules_and_tools() {
        let c = cmd("accelerate launch -m axolotl.cli.train config.yml");
        assert_eq!(c.module(), Some("axolotl.cli.train"));
        assert_eq!(c.args_start(), 4);
        let c = cmd("python -m torch.distributed.run --nproc_per_node 2 -m pkg.train --x 1");
        assert_eq!(c.module(), Some("pkg.train"));
        assert_eq!(
            c.launcher_value(LauncherKind::Torchrun, &["--nproc_per_node"]),
            Some("2")
        );
        let c = cmd("tune run lora_finetune_single_device --config llama3_2/1B_lora batch_size=4");
        assert_eq!(c.tool(), Some("tune"));
        assert_eq!(c.subcommand(), Some("run"));
        assert_eq!(c.override_value(&["batch_size"]), Some("4"));
        let c = cmd("/opt/bin/axolotl train config.yml");
        assert_eq!(c.tool(), Some("axolotl"));
    }

    #[test]
    fn launcher_options_and_script_flags_are_kept_apart() {
        let c = cmd("torchrun --nproc_per_node 4 t.py --nproc_per_node 8");
        assert_eq!(
            c.launcher_value(LauncherKind::Torchrun, &["--nproc_per_node"]),
            Some("4")
        );
        let c = cmd("srun -n 2 --ntasks-per-node 1 python t.py");
        let srun = c.launcher(LauncherKind::Srun).unwrap();
        assert_eq!(c.value_in(srun.opts.clone(), &["-n"]), Some("2"));
        assert_eq!(c.script(), Some("t.py"));
    }

    #[test]
    fn positionals_skip_flag_values_and_overrides() {
        let c = cmd("torchrun --nproc_per_node 2 train.py config/x.py --batch_size=4 --out o y=1");
        let p: Vec<&str> = c.positionals().map(|(_, a)| a).collect();
        assert_eq!(p, vec!["config/x.py"]);
        assert_eq!(c.overrides.len(), 1);
    }

    #[test]
    fn flag_forms() {
        let c = cmd("python t.py --a 1 --b=2 --c --d -1 --e -x");
        let f: Vec<(&str, FlagForm, Option<&str>)> = c
            .flags
            .iter()
            .map(|f| (f.name.as_str(), f.form, f.value.as_deref()))
            .collect();
        assert_eq!(
            f,
            vec![
                ("--a", FlagForm::Space, Some("1")),
                ("--b", FlagForm::Equals, Some("2")),
                ("--c", FlagForm::Bare, None),
                ("--d", FlagForm::Space, Some("-1")),
                ("--e", FlagForm::Bare, None),
                ("-x", FlagForm::Bare, None),
            ]
        );
    }

    #[test]
    fn empty_and_missing() {
        assert_eq!(cmd("").target, Target::Missing);
        assert_eq!(cmd("torchrun --standalone").target, Target::Missing);
    }
}
