//! What runs inside the command that oomguard cannot change, or that changes the
//! settings itself: a shell script in front of the real training command,
//! torchrun's own restarts (`--max-restarts N`), an in-process batch-size finder
//! (the Trainer's `--auto_find_batch_size`, Accelerate's
//! `find_executable_batch_size`). Found once from the command, before anything
//! runs; said at the start of a run (default verbosity) and in `plan`'s notes.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::command::{Command, FlagForm, Target, base_name};

/// At most this much of a script is read to look for a finder or a shebang.
const MAX_SCRIPT_BYTES: u64 = 1 << 20;

/// Shells: a command that starts one runs a shell script oomguard cannot see into.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "fish"];

/// What oomguard learned about the programs inside the command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inside {
    /// The shell script in front of the real command, as written (`./run.sh`,
    /// `bash run.sh`, `bash -c`).
    pub shell_script: Option<String>,
    /// torchrun's `--max-restarts N` (or `--max_restarts`), when N > 0.
    pub torchrun_restarts: Option<u32>,
    /// An in-process batch-size finder: where it was found.
    pub finder: Option<Finder>,
}

/// Where an in-process batch-size finder was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finder {
    /// The Trainer's `--auto_find_batch_size` flag, as written.
    Flag(String),
    /// `auto_find_batch_size: true` in a config file the command names.
    ConfigKey(String),
    /// The script calls Accelerate's `find_executable_batch_size` (or sets
    /// `auto_find_batch_size=True` itself).
    Script(String),
}

impl Inside {
    /// Look at the command, the text of the config files it names (shown name,
    /// text), and the script it runs (read without blocking, at most 1 MiB).
    pub fn find<'a>(cmd: &Command, configs: impl Iterator<Item = (&'a str, &'a str)>) -> Inside {
        // As torchrun reads it: the command line, else `PET_MAX_RESTARTS` (which
        // the Kubeflow operator sets from an elastic policy's `maxRestarts`).
        let torchrun_restarts = crate::frameworks::launchers::torchrun_opt(
            cmd,
            &|k| std::env::var_os(k),
            &["--max-restarts", "--max_restarts"],
        )
        .and_then(|o| o.value.trim().parse::<u32>().ok())
        .filter(|&n| n > 0);
        Inside {
            shell_script: shell_script(cmd),
            torchrun_restarts,
            finder: finder(cmd, configs),
        }
    }

    /// The notes a user must see before the run starts (`plan`'s notes too).
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(s) = &self.shell_script {
            out.push(shell_note(s));
        }
        if let Some(n) = self.torchrun_restarts {
            out.push(format!(
                "torchrun restarts failed workers itself (--max-restarts {n}): its restarts belong to one attempt of oomguard's, and after a GPU OOM oomguard stops torchrun at once, so the settings that ran out are not re-run {n} more time{s} before oomguard decides, once (other failures are still torchrun's to restart)",
                s = if n == 1 { "" } else { "s" }
            ));
        }
        if let Some(f) = &self.finder {
            let (who, what) = match f {
                Finder::Flag(flag) => (flag.clone(), "the Trainer"),
                Finder::ConfigKey(file) => {
                    (format!("auto_find_batch_size in {file}"), "the Trainer")
                }
                Finder::Script(script) => (
                    format!("{script} finds its batch size itself (find_executable_batch_size)"),
                    "it",
                ),
            };
            out.push(format!(
                "{who}: {what} halves the batch inside the process after each OOM it catches, without raising the accumulation: the global batch is the finder's, not oomguard's. oomguard never acts on an OOM the finder catches; it relaunches only when the process dies of one (the finder then starts from oomguard's smaller micro-batch)"
            ));
        }
        out
    }
}

/// What to say about a shell script in front of the real command.
pub fn shell_note(script: &str) -> String {
    format!(
        "{script} is a shell script: oomguard cannot see or change the settings of the command inside it. Put oomguard in front of the real training command (in the script: `oomguard torchrun train.py ...`), or tell it where a setting lives with --knob (an environment variable the script reads: --knob micro_batch=env:MICRO_BS; a flag the script passes on with \"$@\": --knob micro_batch=--per_device_train_batch_size=8)"
    )
}

/// The shell script in front of the real command, as written.
pub(crate) fn shell_script(cmd: &Command) -> Option<String> {
    let Target::Tool { index } = cmd.target else {
        return None;
    };
    let prog = cmd.args.get(index)?;
    let base = base_name(prog);
    if SHELLS.contains(&base) {
        let rest = &cmd.args[index + 1..];
        if rest.iter().any(|a| a == "-c") {
            return Some(format!("`{base} -c`"));
        }
        return Some(match rest.iter().find(|a| !a.starts_with('-')) {
            Some(s) => format!("{base} {s}"),
            None => base.to_string(),
        });
    }
    let by_name = [".sh", ".bash", ".zsh"].iter().any(|e| prog.ends_with(e));
    (by_name || (prog.contains('/') && shebang_is_shell(Path::new(prog)))).then(|| prog.clone())
}

/// Whether the file starts with `#!` naming a shell (`#!/bin/bash`, `#!/usr/bin/env sh`).
fn shebang_is_shell(path: &Path) -> bool {
    let Some(head) = read_head(path, 256) else {
        return false;
    };
    let Some(line) = head
        .strip_prefix("#!")
        .and_then(|h| h.lines().next())
        .map(str::trim)
    else {
        return false;
    };
    let mut words = line.split_whitespace();
    let Some(interp) = words.next().map(base_name) else {
        return false;
    };
    let interp = if interp == "env" {
        match words.find(|w| !w.starts_with('-')) {
            Some(w) => base_name(w),
            None => return false,
        }
    } else {
        interp
    };
    SHELLS.contains(&interp)
}

/// Up to `max` bytes of a regular file, opened without blocking (a FIFO never
/// waits for a writer) and without following a link at its last component; None
/// when it cannot be read.
fn read_head(path: &Path, max: u64) -> Option<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(max).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "true" | "1" | "yes" | "y" | "on"
    )
}

/// An in-process batch-size finder: the Trainer's flag, a config key, or the script.
fn finder<'a>(
    cmd: &Command,
    mut configs: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<Finder> {
    let names = ["--auto_find_batch_size", "--auto-find-batch-size"];
    if let Some(f) = cmd.flags.iter().rfind(|f| names.contains(&f.name.as_str())) {
        let on = match (f.form, f.value.as_deref()) {
            (FlagForm::Bare, _) => true,
            // `--auto_find_batch_size train.py`-like values are not booleans: a bare flag.
            (FlagForm::Space, Some(v)) => truthy(v) || !is_bool_word(v),
            (_, Some(v)) => truthy(v),
            (_, None) => true,
        };
        if on {
            return Some(Finder::Flag(f.name.clone()));
        }
        return None;
    }
    if let Some((shown, _)) = configs.find(|(_, text)| config_sets_finder(text)) {
        return Some(Finder::ConfigKey(shown.to_string()));
    }
    let Target::Script { index } = cmd.target else {
        return None;
    };
    let script = cmd.args.get(index)?;
    let text = read_head(Path::new(script), MAX_SCRIPT_BYTES)?;
    script_has_finder(&text).then(|| Finder::Script(script.clone()))
}

fn is_bool_word(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "true" | "false" | "1" | "0" | "yes" | "no" | "y" | "n" | "on" | "off"
    )
}

/// `auto_find_batch_size: true` (YAML) or `"auto_find_batch_size": true` (JSON).
fn config_sets_finder(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        if l.starts_with('#') {
            return false;
        }
        let Some(at) = l.find("auto_find_batch_size") else {
            return false;
        };
        let rest = l[at + "auto_find_batch_size".len()..]
            .trim_start_matches(['"', '\''])
            .trim_start();
        rest.strip_prefix([':', '='])
            .and_then(|v| v.split([',', '}', ' ', '#']).find(|w| !w.is_empty()))
            .map(|v| v.trim_matches(['"', '\'']))
            .is_some_and(truthy)
    })
}

/// A Python script that calls Accelerate's finder or turns the Trainer's on.
fn script_has_finder(text: &str) -> bool {
    text.lines().any(|l| {
        let code = l.split('#').next().unwrap_or("");
        code.contains("find_executable_batch_size")
            || code.replace(' ', "").contains("auto_find_batch_size=True")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn cmd(words: &[&str]) -> Command {
        let argv: Vec<OsString> = words.iter().map(OsString::from).collect();
        Command::parse(&argv)
    }

    fn inside(words: &[&str]) -> Inside {
        Inside::find(&cmd(words), std::iter::empty())
    }

    #[test]
    fn shell_scripts_are_named_as_written() {
        assert_eq!(
            inside(&["./run.sh"]).shell_script.as_deref(),
            Some("./run.sh")
        );
        assert_eq!(
            inside(&["bash", "-x", "run.sh", "--bs", "8"])
                .shell_script
                .as_deref(),
            Some("bash run.sh")
        );
        assert_eq!(
            inside(&["sh", "-c", "python train.py"])
                .shell_script
                .as_deref(),
            Some("`sh -c`")
        );
        assert_eq!(inside(&["python", "train.py"]).shell_script, None);
        assert_eq!(inside(&["axolotl", "train", "x.yaml"]).shell_script, None);
    }

    #[test]
    fn a_script_without_an_extension_is_a_shell_script_by_its_shebang() {
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path().join("launch");
        std::fs::write(&s, "#!/usr/bin/env bash\nexec python train.py \"$@\"\n").unwrap();
        let p = dir.path().join("train");
        std::fs::write(&p, "#!/usr/bin/env python3\nprint(1)\n").unwrap();
        let s = s.to_str().unwrap();
        assert_eq!(inside(&[s]).shell_script.as_deref(), Some(s));
        assert_eq!(inside(&[p.to_str().unwrap()]).shell_script, None);
    }

    #[test]
    fn torchrun_restarts_in_both_spellings() {
        for w in [
            &["torchrun", "--max-restarts", "2", "train.py"][..],
            &["torchrun", "--max_restarts=2", "train.py"],
            &[
                "python",
                "-m",
                "torch.distributed.run",
                "--max-restarts=2",
                "t.py",
            ],
        ] {
            assert_eq!(inside(w).torchrun_restarts, Some(2), "{w:?}");
        }
        assert_eq!(
            inside(&["torchrun", "--max-restarts", "0", "train.py"]).torchrun_restarts,
            None
        );
        // The script's own flag of the same name is not torchrun's.
        assert_eq!(
            inside(&["torchrun", "train.py", "--max_restarts", "2"]).torchrun_restarts,
            None
        );
    }

    #[test]
    fn finders_on_the_command_line_and_in_configs() {
        let f = |w: &[&str]| inside(w).finder;
        assert_eq!(
            f(&["python", "t.py", "--auto_find_batch_size"]),
            Some(Finder::Flag("--auto_find_batch_size".into()))
        );
        assert_eq!(
            f(&["python", "t.py", "--auto_find_batch_size", "True"]),
            Some(Finder::Flag("--auto_find_batch_size".into()))
        );
        assert_eq!(f(&["python", "t.py", "--auto_find_batch_size=false"]), None);
        assert!(config_sets_finder(
            "micro_batch_size: 2\nauto_find_batch_size: true\n"
        ));
        assert!(config_sets_finder("{\"auto_find_batch_size\": true}"));
        assert!(!config_sets_finder("# auto_find_batch_size: true\n"));
        assert!(!config_sets_finder("auto_find_batch_size: false\n"));
        assert!(script_has_finder(
            "from accelerate.utils import find_executable_batch_size\n"
        ));
        assert!(script_has_finder(
            "args = TrainingArguments(auto_find_batch_size = True)"
        ));
        assert!(!script_has_finder("# find_executable_batch_size\n"));
    }
}
