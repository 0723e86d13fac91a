//! `oomguard completions SHELL` and `oomguard man`: generated from the clap
//! definitions in `cli.rs`, so they never fall behind the options.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::exit;

/// Print the completion script for `shell` on stdout.
pub fn completions_main(shell: clap_complete::Shell) -> i32 {
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "oomguard", &mut buf);
    print(&buf)
}

/// Print the manual page (roff) on stdout: `oomguard man > oomguard.1`.
pub fn man_main() -> i32 {
    let mut buf = Vec::new();
    if let Err(e) = clap_mangen::Man::new(Cli::command()).render(&mut buf) {
        crate::report::terminal::get().error(&format!("cannot render the manual page: {e}"));
        return exit::CANNOT_WRITE;
    }
    print(&buf)
}

fn print(bytes: &[u8]) -> i32 {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => exit::SUCCESS,
        // `| head` closed the pipe: nothing more to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::SUCCESS,
        Err(e) => {
            crate::report::terminal::get().error(&format!("cannot write to standard output: {e}"));
            exit::CANNOT_WRITE
        }
    }
}
