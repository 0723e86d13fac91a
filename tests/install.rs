//! How oomguard fits in beside other ML tools, through the real binary:
//! `--version` names the commit it was built from, `completions` prints a
//! script for bash, zsh and fish, `man` prints a manual page.
//! (`pip install .` itself is checked by `.ci/run`, which builds a wheel into a
//! fresh virtualenv: too slow for a test.)

mod common;
use common::*;

use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn version_names_the_package_and_the_commit_it_was_built_from() {
    let t = tempfile::tempdir().unwrap();
    let run = oomguard(t.path(), &["--version"], None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let want = format!("oomguard {}", env!("CARGO_PKG_VERSION"));
    run.ensure(
        "the version line",
        run.stdout.starts_with(&want) && run.stdout.lines().count() == 1,
        &format!("one line starting with {want:?}"),
        &run.stdout,
    );
    // From a checkout with git, the commit is named: the one HEAD is at now
    // (build.rs reruns when HEAD moves).
    let head = Command::new("git")
        .args(["rev-parse", "--short=9", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success() && repo().join(".git").exists())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(head) = head {
        run.check(
            "the version line with the commit",
            format!("{want} (git {head})\n"),
            run.stdout.clone(),
        );
    }
}

#[test]
fn completions_print_for_bash_zsh_and_fish() {
    let t = tempfile::tempdir().unwrap();
    // Fish spells a long option `-l policy`.
    for (shell, marker, long) in [
        ("bash", "complete -F", "--"),
        ("zsh", "#compdef oomguard", "--"),
        ("fish", "complete -c oomguard", "-l "),
    ] {
        let run = oomguard(t.path(), &["completions", shell], None, LIMIT);
        run.check(&format!("{shell}: exit code"), Some(0), run.code);
        for needle in [
            marker,
            &format!("{long}policy"),
            &format!("{long}max-attempts"),
            "status",
            &format!("{long}follow"),
        ] {
            run.ensure(
                &format!("{shell}: the script"),
                run.stdout.contains(needle),
                &format!("{needle:?} in it"),
                tail(&run.stdout, 400),
            );
        }
        run.check(&format!("{shell}: stderr"), "", &run.stderr);
    }
    let run = oomguard(t.path(), &["completions", "tcsh"], None, LIMIT);
    run.check("an unknown shell is a usage error", Some(2), run.code);
}

#[test]
fn the_man_page_is_roff_naming_oomguard_and_its_subcommands() {
    let t = tempfile::tempdir().unwrap();
    let run = oomguard(t.path(), &["man"], None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let page = &run.stdout;
    run.ensure(
        "a roff page",
        page.starts_with(".ie") || page.starts_with(".TH") || page.contains("\n.TH "),
        "a .TH header",
        tail(page, 400),
    );
    for needle in [".TH oomguard", "\\-\\-policy", "status", "completions"] {
        run.ensure(
            "the man page",
            page.contains(needle),
            &format!("{needle:?} in it"),
            tail(page, 600),
        );
    }
}
