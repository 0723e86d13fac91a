//! Command-line definitions (clap derive) — the raw, unvalidated form.
//!
//! The rest of the program sees the validated `run_config::RunConfig`
//! built from these once parsing is done.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `oomguard --version`: the package version, and the git commit when built
/// from a checkout (see build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), env!("OOMGUARD_VERSION_SUFFIX"));

/// Carry a PyTorch training command through GPU out-of-memory failures.
///
/// Prefix any training command with `oomguard`. It sets the allocator and
/// tokenizer environment, runs the command with its output passed through, and
/// when the run dies of an OOM it changes the training settings by a policy,
/// results first (halve the micro-batch and double gradient accumulation so the
/// global batch stays the same, gradient checkpointing, ZeRO, offload; a shorter
/// sequence only when nothing else is left) — with the model's config known, the
/// fastest settings its calibrated memory model says fit, in one relaunch — and
/// relaunches from the last complete checkpoint.
///
/// Examples:
///
///   oomguard torchrun --nproc_per_node=4 train.py --per_device_train_batch_size 8 --output_dir out
///
///   oomguard plan python train.py --per_device_train_batch_size 8 --output_dir out
///
///   oomguard estimate --gpu-memory 80 python train.py --model_name_or_path ./llama --per_device_train_batch_size 8
///
///   oomguard diagnose crash.log
///
///   oomguard status --follow        (in a second tmux pane)
#[derive(Parser, Debug)]
#[command(
    name = "oomguard",
    version = VERSION,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Exit codes: 0 success; the command's own code when it failed for another reason \
                  (128+N when killed by signal N); 130/143 interrupted by the user; 75 the policy ran \
                  out of steps and the run still does not fit; 74 the next attempt's files (a config copy, \
                  a file edited in place) or the restore record could not be written (disk full): \
                  nothing was relaunched; 2 usage error (also: a run folder someone else could \
                  write, a file --edit-in-place cannot write or another run is editing; `status` or `runs` \
                  found no run); 69 `oomguard gpus` found \
                  no GPU information (no NVIDIA driver, NVML failed); 126/127 the command cannot be \
                  executed / was not found."
)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Show what oomguard would do for this command, and run nothing.
    ///
    /// Prints the knobs it found and where they live, the world size and global
    /// batch, the environment the command would get, the checkpoint it would
    /// resume from, and every rung of the ladder with its exact argv.
    Plan {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Estimate the memory per GPU of the command's settings and of each
    /// setting the policy can reach: weights, gradients, optimizer states,
    /// activations and context, which fit and why. Runs nothing.
    ///
    /// Reads the model's config.json (a local --model_name_or_path folder, the
    /// Hugging Face cache for a hub name, a recipe's base_model) or
    /// `--knob params=7e9`. The GPU's memory comes from NVML or --gpu-memory.
    Estimate {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Show each visible GPU: memory, utilisation, and every process holding memory
    /// (PID, user, memory, and which oomguard run it belongs to). Needs NVML.
    Gpus {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Put back the files a run edited with --edit-in-place (after a hard kill).
    Restore {
        /// The run folder (`.oomguard/runs/<time>`).
        run_dir: PathBuf,
    },
    /// Classify a saved log: GPU OOM, host OOM, an absurd request, another failure, or none.
    Diagnose {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// A kernel log (`dmesg`, `journalctl -k`) from the same machine and time: a
        /// process the kernel's OOM killer killed makes a SIGKILL a host OOM.
        #[arg(long, value_name = "FILE")]
        kernel_log: Option<PathBuf>,
        /// Score the scanner on labelled logs (each `# label: ...`, `# ---`, the log):
        /// recall and precision per class, then every log found otherwise, then every
        /// `unsettled` log (not scored) with what it was found as.
        #[arg(long, value_name = "DIR", num_args = 1.., conflicts_with_all = ["file", "kernel_log"])]
        score: Vec<PathBuf>,
        /// The log file; standard input when absent or `-`.
        file: Option<PathBuf>,
    },
    /// Where a run stands, going or finished: the attempt, its settings against the
    /// original, the last OOM and the decision, the step reached, peak GPU memory,
    /// elapsed and lost time, and whether oomguard is still running it.
    ///
    /// Read from the run's journal; nothing is written. Examples:
    ///
    ///   oomguard status                 (the newest run under .oomguard/runs)
    ///
    ///   oomguard status --follow        (updated in place: for a second tmux pane)
    Status {
        /// One JSON object (with --follow: one a line, each time the status changes).
        #[arg(long)]
        json: bool,
        /// Update until the run ends (in place on a terminal; otherwise a new
        /// block each time the status changes). A run folder without a journal
        /// yet is waited for.
        #[arg(short, long)]
        follow: bool,
        /// Seconds between updates with --follow.
        #[arg(long, value_name = "SECS", default_value_t = 2.0, requires = "follow")]
        interval: f64,
        /// The run folder [default: the newest under .oomguard/runs].
        run_dir: Option<PathBuf>,
    },
    /// List the runs under .oomguard/runs in this folder, oldest first, one line
    /// each: when, how it ended (or that it is running), attempts, the command.
    Runs {
        /// One JSON object: `runs`, a list.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script on standard output.
    ///
    /// bash: oomguard completions bash > ~/.local/share/bash-completion/completions/oomguard
    ///
    /// zsh:  oomguard completions zsh > ~/.zfunc/_oomguard   (with fpath+=~/.zfunc before compinit)
    ///
    /// fish: oomguard completions fish > ~/.config/fish/completions/oomguard.fish
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff) on standard output.
    ///
    /// oomguard man > ~/.local/share/man/man1/oomguard.1 && man oomguard
    Man,
}

/// Options shared by `oomguard COMMAND` and `oomguard plan COMMAND`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Policy: a shipped name (default, keep-results, keep-micro-batch, smaller-batch) or a TOML file.
    #[arg(long, value_name = "NAME|FILE", default_value = "default")]
    pub policy: String,

    /// Stop after this many attempts (overrides the policy's max_attempts).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,

    /// Where the journal and each attempt's output go [default: .oomguard/runs/<time>/].
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    /// Say where a knob lives: a flag (`micro_batch=--bs`), a key in a file
    /// (`micro_batch=config.yaml:training.micro_batch_size`), an override
    /// (`micro_batch=data.batch_size`, or `micro_batch=+data.batch_size=64` to add one
    /// starting from its default), or an environment variable (`micro_batch=env:MICRO_BS`).
    /// Knobs: micro_batch, grad_accum, seq_len, grad_checkpointing, zero_stage,
    /// offload_optimizer, offload_param, dataloader_workers (halved after a host
    /// OOM), eval_batch (halved after an OOM during evaluation). Repeatable.
    ///
    /// `--knob params=7e9` gives the model's parameter count when oomguard finds
    /// no model config (`--model_name_or_path` folder, the Hugging Face cache, a
    /// recipe's `base_model`) for its memory model.
    #[arg(long, value_name = "NAME=WHERE")]
    pub knob: Vec<String>,

    /// Start as the command is written, ignoring the settings that fit the last
    /// run of the same command on the same GPUs (remembered in
    /// `$XDG_STATE_HOME/oomguard/fits.json`).
    #[arg(long)]
    pub fresh: bool,

    /// Start at the fastest settings the memory model predicts to fit when the
    /// command as given is predicted not to (by more than the model's 10%
    /// error), instead of waiting for the OOM; without it the prediction is
    /// said in one line at the start. Needs a model (config.json) and the GPU's size.
    #[arg(long)]
    pub fit: bool,

    /// The memory of each GPU, in GiB, for the memory model when no OOM message
    /// or NVML has told it yet (`estimate` and the first decision).
    #[arg(long, value_name = "GIB")]
    pub gpu_memory: Option<f64>,

    /// Do not add the default environment (allocator, tokenizers, unbuffered Python).
    #[arg(long)]
    pub no_env: bool,

    /// After an OOM that ended a traceback, a child silent for this long is killed and
    /// treated as an OOM (at most 31536000, a year).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = seconds)]
    pub hang_timeout: f64,

    /// Seconds between SIGTERM and SIGKILL when stopping the command's process group
    /// (at most 31536000, a year).
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = seconds)]
    pub grace: f64,

    /// Before each attempt, wait until this much GPU memory is free on each of the
    /// run's GPUs (`auto`: the peak the last successful run of this command used). Needs NVML.
    #[arg(long, value_name = "GIB|auto")]
    pub wait_for_memory: Option<String>,

    /// Give up waiting for GPU memory (before an attempt, or for another tenant's
    /// memory after an OOM that was not the run's) after this long, and go on
    /// (at most 31536000, a year).
    #[arg(long, value_name = "SECS", default_value_t = 1800.0, value_parser = seconds)]
    pub wait_timeout: f64,

    /// Pick the N GPUs with the most free memory (`auto:N`): sets
    /// CUDA_VISIBLE_DEVICES, and the world size follows. Needs NVML.
    #[arg(long, value_name = "auto:N")]
    pub gpus: Option<String>,

    /// Seconds between status lines while waiting for GPU memory (for tests).
    #[arg(long, value_name = "SECS", default_value_t = 300.0, hide = true, value_parser = seconds)]
    pub wait_status_every: f64,

    /// Allow changing a knob in a file the command does not name (a module the
    /// script imports): edited in place, the original kept in the run folder and
    /// restored when the run ends (`oomguard restore RUN_DIR` after a hard kill).
    #[arg(long)]
    pub edit_in_place: bool,

    /// More detail on stderr (repeat for more).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Only errors and the final summary on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// The training command and its arguments, passed byte-exact (no shell).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND",
        num_args = 1..
    )]
    pub command: Vec<OsString>,
}

/// The largest number of seconds a duration flag takes: a year. Larger values mean
/// "never" in practice, and past about 1.8e19 seconds a `Duration` cannot hold them
/// (std panics), nor can a deadline (`Instant + Duration`) far short of that.
pub const MAX_SECONDS: f64 = 31_536_000.0;

/// Why a duration flag's value was refused; clap prints it after
/// "invalid value '…' for '--grace <SECS>':".
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SecondsError {
    #[error("{0:?} is not a number of seconds")]
    NotANumber(String),
    /// Negative, infinite or NaN.
    #[error("{0} is not a number of seconds (0 or more)")]
    NotZeroOrMore(String),
    #[error("{0} seconds is more than the largest allowed, {MAX_SECONDS} (a year)")]
    TooLarge(String),
}

/// A number of seconds for `--hang-timeout`, `--grace` and `--wait-timeout`: finite,
/// not negative, at most [`MAX_SECONDS`]. A bad value is a usage error (exit 2).
fn seconds(s: &str) -> Result<f64, SecondsError> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| SecondsError::NotANumber(s.to_string()))?;
    if !v.is_finite() || v < 0.0 {
        return Err(SecondsError::NotZeroOrMore(s.to_string()));
    }
    if v > MAX_SECONDS {
        return Err(SecondsError::TooLarge(s.to_string()));
    }
    Ok(v)
}

/// A command that starts with `-` where no `--` came before it: almost always a
/// mistyped oomguard option (`--max-attemps 3 python train.py`), which clap's
/// trailing argument would otherwise take for the program to run ("command not
/// found", 127, and a run folder left behind). `raw` is the whole argv, `command`
/// what clap took as the command. The error names the nearest oomguard option.
pub fn mistyped_option(raw: &[OsString], command: &[OsString]) -> Option<String> {
    let first = command.first()?.to_str()?;
    if !first.starts_with('-') || first == "-" {
        return None;
    }
    // `oomguard -- -weird-program`: the user said where the command starts.
    let at = raw.iter().position(|a| a == first)?;
    if raw[..at].iter().any(|a| a == "--") {
        return None;
    }
    let typed = first.split('=').next().unwrap_or(first);
    let mut options: Vec<String> = Vec::new();
    let root = <Cli as clap::CommandFactory>::command();
    let subcommand = raw[1..at]
        .iter()
        .filter_map(|a| a.to_str())
        .find_map(|a| root.find_subcommand(a));
    let cmd = subcommand.unwrap_or(&root);
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            options.push(format!("--{long}"));
        }
        if let Some(short) = arg.get_short() {
            options.push(format!("-{short}"));
        }
    }
    options.extend(["--help".to_string(), "--version".to_string()]);
    let nearest = options
        .iter()
        .map(|o| (edit_distance(typed, o), o))
        .min_by_key(|(d, _)| *d)
        .filter(|(d, o)| *d <= (o.len() / 3).max(2))
        .map(|(_, o)| o.clone());
    let hint = match nearest {
        Some(o) => format!("did you mean '{o}'? "),
        None => String::new(),
    };
    Some(format!(
        "'{typed}' is not an oomguard option; {hint}(`oomguard --help` lists them). \
         The command to run starts at the first word that is not an option: \
         write `oomguard -- {first} ...` if the program's name really starts with '-'. \
         Nothing was run."
    ))
}

/// Levenshtein distance over chars (option names are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn check(line: &str) -> Option<String> {
        let raw = argv(line);
        let cli = Cli::try_parse_from(&raw).expect("parses");
        let command = match cli.sub {
            Some(Sub::Plan { run, .. }) | Some(Sub::Estimate { run, .. }) => run.command,
            _ => cli.run.command,
        };
        mistyped_option(&raw, &command)
    }

    #[test]
    fn a_mistyped_option_before_the_command_names_the_nearest_one() {
        let e = check("oomguard --max-attemps 3 python train.py").expect("refused");
        assert!(
            e.contains("'--max-attemps' is not an oomguard option"),
            "{e}"
        );
        assert!(e.contains("did you mean '--max-attempts'?"), "{e}");
        let e = check("oomguard --hang-timout=5 python train.py").expect("refused");
        assert!(e.contains("did you mean '--hang-timeout'?"), "{e}");
        let e = check("oomguard plan --polcy x python train.py").expect("refused");
        assert!(e.contains("did you mean '--policy'?"), "{e}");
        let e = check("oomguard --zzzzzzzzzzzz python train.py").expect("refused");
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn commands_and_their_own_options_are_left_alone() {
        assert_eq!(check("oomguard python train.py --max-attemps 3"), None);
        assert_eq!(check("oomguard -v torchrun --nproc_per_node 2 t.py"), None);
        assert_eq!(check("oomguard -- -odd-program --x"), None);
        assert_eq!(check("oomguard --max-attempts 3 -- python t.py"), None);
    }

    #[test]
    fn edit_distance_counts_single_changes() {
        assert_eq!(edit_distance("--max-attemps", "--max-attempts"), 1);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("", "ab"), 2);
    }

    #[test]
    fn seconds_are_finite_and_at_most_a_year() {
        assert_eq!(seconds("30"), Ok(30.0));
        assert_eq!(seconds("0.2"), Ok(0.2));
        assert_eq!(seconds("31536000"), Ok(MAX_SECONDS));
        for bad in ["1e20", "1e300", "inf", "NaN", "-1", "x", "31536000.5"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
