//! Puts the git commit in `oomguard --version` when built from a checkout.
//!
//! Sets `OOMGUARD_VERSION_SUFFIX` to ` (git abc1234)` when `git rev-parse` works
//! here, else to the empty string: a crates.io package or a pip sdist has no
//! `.git`, and a machine may have no `git`; neither is an error.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let mut suffix = String::new();
    // `.git` is a folder in a clone and a file in a worktree.
    if Path::new(".git").exists()
        && let Some(commit) = git(&["rev-parse", "--short=9", "HEAD"])
    {
        suffix = format!(" (git {commit})");
        // Rebuild when HEAD moves: the file HEAD, the branch it names, and
        // packed-refs (a branch's ref may live there). Paths come from git, so
        // worktrees (whose refs live in the common folder) are right too.
        let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(branch);
        }
        for p in watch {
            // Only files that exist: cargo reruns a script watching a
            // missing path on every build.
            if let Some(path) = git(&["rev-parse", "--git-path", &p])
                && Path::new(&path).exists()
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!("cargo:rustc-env=OOMGUARD_VERSION_SUFFIX={suffix}");
}
