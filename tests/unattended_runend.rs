//! The end of an unattended run, through the real binary: a run killed while a module
//! was edited in place does not poison the next one, and the numbers at the end
//! (the time lost to OOMs, a killed run's duration, the command line to rerun) can
//! be trusted.

mod common;
use common::*;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const QUICK: Duration = Duration::from_secs(30);

const OOM_LINE: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is free.";

/// The module the training script imports: micro-batch 16 × accumulation 2.
const MODULE: &str =
    "# training settings\nBATCH_SIZE = 16  # per device\nGRAD_ACCUM = 2\nLR = 3e-4\n";

/// A project whose `train.py` reads its batch size from `config/config.py`: above 8 it
/// dies of a CUDA OOM; at 8 or less it says `ready` (in a file) and trains until a
/// `stop` file appears.
fn module_project(dir: &Path) {
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(dir.join("config/__init__.py"), "").unwrap();
    std::fs::write(dir.join("config/config.py"), MODULE).unwrap();
    std::fs::write(
        dir.join("train.py"),
        format!(
            "import os,sys,time\nfrom config import config\n\
             print('batch', config.BATCH_SIZE, 'accum', config.GRAD_ACCUM, flush=True)\n\
             if config.BATCH_SIZE > 8:\n    print({OOM_LINE:?}, file=sys.stderr)\n    sys.exit(1)\n\
             open('ready', 'w').write('ready')\n\
             while not os.path.exists('stop'):\n    time.sleep(0.02)\n"
        ),
    )
    .unwrap();
}

const IN_PLACE: &[&str] = &[
    "--edit-in-place",
    "--knob",
    "micro_batch=config/config.py:BATCH_SIZE",
    "--knob",
    "grad_accum=config/config.py:GRAD_ACCUM",
    "python3",
    "train.py",
];

fn run_folders(cwd: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(cwd.join(".oomguard/runs"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Issue 19, point 5: a hard kill of an `--edit-in-place` run leaves the module edited
/// (16×2 became 8×4). `status` and `runs` say so and name `oomguard restore RUN_DIR`; a
/// second run of the same command refuses to start (exit 2, naming that command) instead
/// of taking 8×4 for the original, and creates nothing; after the restore the module is
/// byte for byte the original and a new run starts from 16×2.
#[test]
fn a_killed_edit_in_place_run_is_named_and_refused_until_restored() {
    let t = tempfile::tempdir().unwrap();
    let proj = t.path();
    module_project(proj);
    let xdg = proj.join("xdg");
    let xdg_s = xdg.to_str().unwrap().to_owned();
    let envs = [("XDG_RUNTIME_DIR", xdg_s.as_str())];
    let module = proj.join("config/config.py");

    let mut first = spawn_env(proj, IN_PLACE, &envs);
    let ready = proj.join("ready");
    assert!(
        wait_until(LIMIT, || ready.exists()),
        "attempt 2 never started with the edited module"
    );
    let edited = std::fs::read_to_string(&module).unwrap();
    assert!(
        edited.contains("BATCH_SIZE = 8") && edited.contains("GRAD_ACCUM = 4"),
        "the relaunch edited the module to 8×4: {edited}"
    );
    // A hard kill: oomguard cannot put the module back.
    first.child.kill().unwrap();
    let killed = first.wait(QUICK);
    std::fs::remove_file(&ready).unwrap();
    assert_eq!(std::fs::read_to_string(&module).unwrap(), edited);
    let runs = run_folders(proj);
    assert_eq!(runs.len(), 1, "one run folder: {runs:?}");
    let name = runs[0].file_name().unwrap().to_str().unwrap().to_owned();
    let rel = format!(".oomguard/runs/{name}");
    let restore_cmd = format!("oomguard restore {rel}");

    // status and runs say it.
    let st = oomguard_env(proj, &["status", &rel], &envs);
    st.check("status: exit code", Some(0), st.code);
    st.ensure(
        "status says the run was killed with the module still edited, and to restore it",
        st.stdout.contains("killed")
            && st
                .stdout
                .contains("config.py still holds this run's in-place edit")
            && st.stdout.contains(&format!("run `{restore_cmd}`")),
        &format!("killed, 'config.py still holds this run's in-place edit', `{restore_cmd}`"),
        &st.stdout,
    );
    let stj = oomguard_env(proj, &["status", "--json", &rel], &envs);
    let v: Value = serde_json::from_str(&stj.stdout).unwrap();
    stj.check("state", &Value::from("killed"), &v["state"]);
    stj.check("restore_needed", &Value::from(true), &v["restore_needed"]);
    stj.ensure(
        "still_edited names the module",
        v["still_edited"][0]
            .as_str()
            .is_some_and(|p| p.ends_with("config/config.py")),
        "config/config.py",
        &v["still_edited"],
    );
    let list = oomguard_env(proj, &["runs"], &envs);
    list.ensure(
        "runs marks the run and names the restore",
        list.stdout.contains("killed, still edited") && list.stdout.contains(&restore_cmd),
        &format!("'killed, still edited' and `{restore_cmd}`"),
        &list.stdout,
    );

    // The same command again: refused before anything runs or is created.
    let again = oomguard_env(proj, IN_PLACE, &envs);
    again.check("a second run: exit code", Some(2), again.code);
    again.ensure(
        "the refusal names the module and the restore command",
        again
            .stderr
            .contains("config/config.py still holds the in-place edit")
            && again.stderr.contains("oomguard restore ")
            && again.stderr.contains(&name),
        &format!("config/config.py, `oomguard restore …{name}`"),
        &again.stderr,
    );
    again.ensure(
        "the command never started",
        !again.stdout.contains("batch"),
        "no output of train.py",
        &again.stdout,
    );
    assert_eq!(
        run_folders(proj),
        runs,
        "the refused run created no run folder"
    );
    assert_eq!(
        std::fs::read_to_string(&module).unwrap(),
        edited,
        "the refused run left the module as it was"
    );

    // restore, then the module is the original byte for byte and a new run starts.
    let r = oomguard_env(proj, &["restore", &rel], &envs);
    r.check("restore: exit code", Some(0), r.code);
    assert_eq!(std::fs::read_to_string(&module).unwrap(), MODULE);
    let st = oomguard_env(proj, &["status", &rel], &envs);
    st.ensure(
        "after the restore, status no longer asks for one",
        !st.stdout.contains("oomguard restore"),
        "no restore advice",
        &st.stdout,
    );
    std::fs::write(proj.join("stop"), "").unwrap();
    let next = oomguard_env(proj, IN_PLACE, &envs);
    next.check("a new run after the restore: exit code", Some(0), next.code);
    next.ensure(
        "the new run starts from the original 16×2 and relaunches at 8×4",
        next.stdout.contains("batch 16 accum 2") && next.stdout.contains("batch 8 accum 4"),
        "batch 16 accum 2, then batch 8 accum 4",
        &next.stdout,
    );
    assert_eq!(std::fs::read_to_string(&module).unwrap(), MODULE);
    drop(killed);
}

/// `oomguard ARGS` in `cwd` with `envs`, waited for.
fn oomguard_env(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> Run {
    spawn_env(cwd, args, envs).wait(LIMIT)
}
