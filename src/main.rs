//! oomguard: carry a PyTorch training command through GPU out-of-memory failures.
//!
//! `main` is thin: parse the command line, call one function per subcommand,
//! map the result to an exit code. Every subcommand's entry point is named
//! `<subcommand>_main` and returns the exit code (`detect::diagnose_main`,
//! `gpu::gpus_main`, `status::runs_main`, ...); a run without a subcommand is
//! `supervise::run`. `run`, `plan` and `estimate` share [`configure`]: the
//! options, the one live service inspection needs (the GPU watch), and the
//! target inspected with what it said.

#[cfg(test)]
mod alloc_count;
mod checkpoint;
mod cli;
mod command;
mod completions;
mod detect;
mod envmerge;
mod events;
mod evidence;
mod exit;
mod files;
mod frameworks;
mod gpu;
mod gpuwatch;
mod inplace;
mod inside;
mod job;
mod journal;
mod knobs;
mod launch;
mod liveness;
mod loadable;
mod memory;
mod next;
mod options;
mod plan;
mod policy;
mod progress;
mod remember;
mod report;
mod resume;
mod run_config;
mod run_folder;
mod settings;
mod signal;
mod status;
mod supervise;
mod target;
mod torch_save;
mod untrusted;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Read the inherited signal dispositions before anything changes one (nohup's SIGHUP).
    launch::inherited_ignored();
    let args: Vec<OsString> = std::env::args_os().collect();
    // The guardian that kills the command's process group if oomguard dies
    // (see launch::guard). Dispatched before clap: it is not a user command.
    if args.get(1).is_some_and(|a| a == "__guard") {
        launch::guard_main(&args[2..]);
    }
    let code = run(args);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn run(args: Vec<OsString>) -> i32 {
    let cli = match cli::Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    exit::SUCCESS
                }
                _ => exit::USAGE,
            };
        }
    };
    let command = match &cli.sub {
        Some(cli::Sub::Plan { run, .. }) | Some(cli::Sub::Estimate { run, .. }) => &run.command,
        _ => &cli.run.command,
    };
    if let Some(e) = cli::mistyped_option(&args, command) {
        return usage_error(&e);
    }
    if cli.sub.is_some() {
        // A report (`plan … | head`) ends quietly when its reader goes away, as
        // other Unix tools do, instead of panicking on the broken pipe. Not for a
        // run: oomguard itself must never die of its output's reader.
        // SAFETY: setting a disposition has no memory-safety implications.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.sub {
        Some(cli::Sub::Diagnose {
            json,
            kernel_log,
            score,
            file,
        }) => detect::diagnose_main(file.as_deref(), kernel_log.as_deref(), &score, json),
        Some(cli::Sub::Gpus { json }) => gpu::gpus_main(json),
        Some(cli::Sub::Restore { run_dir }) => inplace::restore_main(&run_dir),
        Some(cli::Sub::Status {
            json,
            follow,
            interval,
            run_dir,
        }) => status::status_main(run_dir.as_deref(), json, follow, interval),
        Some(cli::Sub::Runs { json }) => status::runs_main(json),
        Some(cli::Sub::Completions { shell }) => completions::completions_main(shell),
        Some(cli::Sub::Man) => completions::man_main(),
        Some(cli::Sub::Estimate { json, run }) => {
            init_tracing(run.verbose, run.quiet);
            match configure(run) {
                Ok((cfg, _gpus)) => plan::estimate_main(&cfg, json),
                Err(e) => usage_error(&e),
            }
        }
        Some(cli::Sub::Plan { json, run }) => {
            init_tracing(run.verbose, run.quiet);
            match configure(run) {
                Ok((cfg, _gpus)) => plan::plan_main(&cfg, json),
                Err(e) => usage_error(&e),
            }
        }
        None => {
            init_tracing(cli.run.verbose, cli.run.quiet);
            let (cfg, gpus) = match configure(cli.run) {
                Ok(c) => c,
                Err(e) => return usage_error(&e),
            };
            let signals = match launch::Signals::install() {
                Ok(s) => s,
                Err(e) => {
                    report::terminal::get().error(&format!("cannot install signal handlers: {e}"));
                    return exit::CANNOT_EXECUTE;
                }
            };
            supervise::run(&cfg, gpus, &signals)
        }
    }
}

/// The options of `run`, `plan` and `estimate`, the GPU watch (the one live
/// service they share: it picks `--gpus auto:N` and says how many GPUs and how
/// much memory there are), and the target inspected with what it said.
fn configure(
    args: cli::RunArgs,
) -> Result<(run_config::RunConfig, gpuwatch::GpuWatch), run_config::ConfigError> {
    let opts = options::Options::from_args(args)?;
    let gpus = gpuwatch::GpuWatch::open(opts.gpu.clone(), &opts.argv)?;
    let cfg = run_config::RunConfig::new(opts, &target::GpuFacts::of(&gpus))?;
    Ok((cfg, gpus))
}

fn usage_error(e: &dyn std::fmt::Display) -> i32 {
    report::terminal::get().error(&e.to_string());
    exit::USAGE
}

/// How much oomguard says, decided once: its terminal's verbosity, and the
/// level of its tracing (`OOMGUARD_LOG` overrides the latter).
fn init_tracing(verbose: u8, quiet: bool) {
    report::terminal::init(report::terminal::Verbosity::of(quiet, verbose));
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, _) => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("OOMGUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
