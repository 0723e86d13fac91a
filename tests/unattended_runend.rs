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

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `--run-dir RUN` and the README demo (16 and 8 OOM at step 7, 4 fits, checkpoints
/// every 5 steps), with `extra` trainer flags.
fn demo(run_dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--run-dir".to_string(), run_dir.display().to_string()];
    args.extend(demo_args(out));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The seconds in "N.N s" just before `marker` in `text`.
fn secs_before(text: &str, marker: &str) -> Option<f64> {
    let at = text.find(marker)?;
    let before = text[..at].trim_end().strip_suffix(" s")?;
    before.rsplit(' ').next()?.parse().ok()
}

/// Issue 19, point 9: one figure for the time the OOMs cost — from each OOM until the
/// relaunch was back at the step it died at (restart and redone steps) — in the summary,
/// the journal (`time_lost`, `run_end.time_lost_s`) and `status`, where the summary
/// used to give two that disagreed; and the command line the last attempt ran, to rerun
/// at the settings that fit.
#[test]
fn the_summary_gives_one_time_lost_figure_and_the_command_line_to_rerun() {
    let t = tempfile::tempdir().unwrap();
    let (out, run_dir) = (t.path().join("out"), t.path().join("run"));
    let run = oomguard(t.path(), &strs(&demo(&run_dir, &out, &[])), None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let err = &run.stderr;
    let figure = "from each OOM back to the step it died at (restart and redone steps)";
    run.ensure(
        "one time figure, with the steps redone",
        err.contains("oomguard: work lost to 2 OOMs: 2 steps of redone training; ")
            && err.contains(figure)
            && !err.contains("lost to failed attempts")
            && err.contains("oomguard: finished after 3 attempts; "),
        figure,
        tail(err, 2500),
    );
    let shown = secs_before(err, figure).unwrap_or_else(|| run.fail("seconds", figure, err));
    let j = run.journal(&run_dir);
    let lost = events(&j, "time_lost");
    let backs: Vec<&&Value> = lost.iter().filter(|e| e["state"] == "back").collect();
    run.check("two stretches got back", 2, backs.len());
    for (b, oom) in backs.iter().zip([1, 2]) {
        run.check("the stretch's OOM", &serde_json::json!([oom]), &b["ooms"]);
        run.check(
            "back at the step it died at",
            Some(6),
            b["back_to_step"].as_u64(),
        );
        run.check(
            "back in the next attempt",
            Some(oom + 1),
            b["attempt"].as_u64(),
        );
    }
    let sum: f64 = backs.iter().map(|b| b["seconds"].as_f64().unwrap()).sum();
    let end = events(&j, "run_end")[0];
    let total = end["time_lost_s"].as_f64().unwrap();
    run.ensure(
        "the summary's figure is the journal's sum",
        (total - sum).abs() < 1e-6 && (shown - total).abs() <= 0.051,
        &format!("{total:.1} s"),
        shown,
    );
    run.check("complete", &Value::from(true), &end["time_lost_complete"]);
    // Each stretch runs from an OOM to the relaunch's step 6: together less than the
    // whole run (the gaps between attempts, decision and resume, count in it, so the
    // attempts' own durations are no bound).
    let whole = run.elapsed.as_secs_f64();
    run.ensure(
        "less than the whole run",
        total < whole,
        &format!("< {whole:.2}"),
        total,
    );

    // The command line to rerun: exactly what the last attempt ran.
    let last = argv_of(events(&j, "attempt_start")[2]);
    let line = last
        .iter()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{a}'")
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    run.ensure(
        "the summary gives the last attempt's command line to rerun",
        err.contains(&format!(
            "oomguard: to rerun at the settings that fit: {line}\n"
        )) && line.contains("--per_device_train_batch_size 4 --gradient_accumulation_steps 8"),
        &line,
        tail(err, 2500),
    );
    run.ensure(
        "and says the resume argument is oomguard's",
        err.contains(&format!(
            "it resumes from {}/checkpoint-5 (added by oomguard)",
            out.display()
        )),
        "it resumes from …/checkpoint-5 (added by oomguard)",
        tail(err, 1500),
    );
    run.check(
        "run_end.last_command",
        &Value::from(line.clone()),
        &end["last_command"],
    );

    // status says the same figure.
    let st = oomguard(
        t.path(),
        &["status", "--json", run_dir.to_str().unwrap()],
        None,
        QUICK,
    );
    let v: Value = serde_json::from_str(&st.stdout).unwrap();
    st.check("status time_lost_s", Some(total), v["time_lost_s"].as_f64());
    st.check(
        "status time_lost_exact",
        &Value::from(true),
        &v["time_lost_exact"],
    );
    let st = oomguard(
        t.path(),
        &["status", run_dir.to_str().unwrap()],
        None,
        QUICK,
    );
    st.ensure(
        "status's time line has the figure, not the whole failed attempts",
        st.stdout
            .contains("from each OOM back to the step it died at (2 steps redone)")
            && !st.stdout.contains("lost to failed attempts"),
        "… from each OOM back to the step it died at (2 steps redone)",
        &st.stdout,
    );
}

/// Where a knob lives in a config file the command names, the command line to rerun
/// names oomguard's copy of it, and the summary says so.
#[test]
fn the_command_line_to_rerun_names_the_config_copy() {
    let t = tempfile::tempdir().unwrap();
    let (out, run_dir) = (t.path().join("out"), t.path().join("run"));
    let cfg = t.path().join("train.json");
    std::fs::write(&cfg, r#"{"batch": 16, "accum": 2}"#).unwrap();
    // A launcher script that reads its batch from the JSON file it is given.
    let wrap = t.path().join("wrap.py");
    std::fs::write(
        &wrap,
        format!(
            "import json,os,sys\nc = json.load(open(sys.argv[2]))\n\
             os.execvp('python3', ['python3', {sim:?}, '--per_device_train_batch_size', str(c['batch']), \
             '--gradient_accumulation_steps', str(c['accum'])] + sys.argv[3:])\n",
            sim = sim()
        ),
    )
    .unwrap();
    let (run_s, cfg_s, wrap_s, out_s) = (
        run_dir.display().to_string(),
        cfg.display().to_string(),
        wrap.display().to_string(),
        out.display().to_string(),
    );
    let mb = format!("micro_batch={cfg_s}:batch");
    let ga = format!("grad_accum={cfg_s}:accum");
    let args = [
        "--run-dir",
        &run_s,
        "--knob",
        &mb,
        "--knob",
        &ga,
        "python3",
        &wrap_s,
        "--config",
        &cfg_s,
        "--max_seq_length",
        "1024",
        "--max_steps",
        "12",
        "--save_steps",
        "5",
        "--step_seconds",
        "0.005",
        "--output_dir",
        &out_s,
    ];
    let run = oomguard(t.path(), &args, None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let copy = run_dir.join("attempt-3").join("train.json");
    let err = &run.stderr;
    run.ensure(
        "the line to rerun reads the copy, and the summary says whose copy it is",
        err.contains(&format!(
            "oomguard: to rerun at the settings that fit: python3 {wrap_s} --config {}",
            copy.display()
        )) && err.contains(&format!(
            "{} is oomguard's copy of {cfg_s} with the changed settings",
            copy.display()
        )),
        &copy.display().to_string(),
        tail(err, 2500),
    );
    let copied: Value = serde_json::from_str(&std::fs::read_to_string(&copy).unwrap()).unwrap();
    run.check(
        "the copy holds 4 × 8",
        serde_json::json!({"batch": 4, "accum": 8}),
        copied,
    );
}

/// When the step an OOM died at was not seen (the Trainer's log dicts without
/// `--logging_steps`), the time back is "unknown", never "(0.0 s)"; when the run ends
/// before the relaunch is back (a Ctrl-C), the figure is a lower bound that says so.
#[test]
fn an_unknown_or_unfinished_time_back_is_said_so() {
    let t = tempfile::tempdir().unwrap();
    let (out, run_dir) = (t.path().join("out"), t.path().join("run"));
    let run = oomguard(
        t.path(),
        &strs(&demo(&run_dir, &out, &["--disable_tqdm"])),
        None,
        LIMIT,
    );
    run.check("exit code", Some(0), run.code);
    run.ensure(
        "unknown, without a number",
        run.stderr.contains(
            "an unknown number of steps of redone training; the time from each OOM back to the step it died at is unknown; the step attempts 1, 2 died at were not seen exactly",
        ) && !run.stderr.contains("(0.0 s)"),
        "… is unknown; the step attempts 1, 2 died at were not seen exactly …",
        tail(&run.stderr, 2000),
    );

    // Slow steps: the relaunch is interrupted before it is back at step 6.
    let (out, run_dir) = (t.path().join("out2"), t.path().join("run2"));
    let running = spawn_env(
        t.path(),
        &strs(&demo(&run_dir, &out, &["--step_seconds", "0.3"])),
        &[],
    );
    let journal = run_dir.join("journal.jsonl");
    assert!(
        wait_until(LIMIT, || std::fs::read_to_string(&journal).is_ok_and(|j| j
            .contains(r#""attempt":2,"event":"attempt_start""#)
            || j.contains(r#""event":"attempt_start""#)
                && j.matches("attempt_start").count() >= 2)),
        "attempt 2 never started"
    );
    // SAFETY: a signal to the oomguard this test started.
    unsafe { libc::kill(running.child.id() as i32, libc::SIGINT) };
    let run = running.wait(LIMIT);
    run.check("interrupted: exit code", Some(130), run.code);
    run.ensure(
        "a lower bound, saying the relaunch had not got back",
        run.stderr.contains("oomguard: work lost to 1 OOM: ")
            && run.stderr.contains("; at least ")
            && run
                .stderr
                .contains("attempt 2 had not got back to step 6 when the run ended")
            && run.stderr.contains("oomguard: the last attempt ran: "),
        "at least …; attempt 2 had not got back to step 6 when the run ended",
        tail(&run.stderr, 2000),
    );
    let j = run.journal(&run_dir);
    let end = events(&j, "run_end")[0];
    run.check(
        "not complete",
        &Value::from(false),
        &end["time_lost_complete"],
    );
}

/// A run whose oomguard is SIGKILLed has no end in its journal: `status` and `runs`
/// give it the time it really ran (up to its last output), marked killed — not the
/// time of its last journal line, and not 0.0 s.
#[test]
fn a_killed_run_shows_the_time_it_really_ran() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let mut args = demo_args(&out);
    args.extend(["--step_seconds".to_string(), "0.1".to_string()]);
    args.iter_mut().for_each(|a| {
        if a == "30" {
            *a = "400".into()
        }
    });
    let running = spawn_env(t.path(), &strs(&args), &[]);
    let started = std::time::Instant::now();
    let runs = t.path().join(".oomguard/runs");
    let third = || {
        run_folders(t.path())
            .first()
            .is_some_and(|d| d.join("attempt-3/output.log").exists())
    };
    assert!(wait_until(LIMIT, third), "attempt 3 never started");
    // Attempt 3 trains on, printing a step every 0.1 s, with no journal line.
    std::thread::sleep(Duration::from_secs(4));
    let mut running = running;
    running.child.kill().unwrap();
    let ran = started.elapsed().as_secs_f64();
    let _ = running.wait(QUICK);
    let (list, v) = {
        let r = oomguard(t.path(), &["runs", "--json"], None, QUICK);
        let v: Value = serde_json::from_str(&r.stdout).unwrap();
        (r, v)
    };
    let line = &v["runs"][0];
    list.check("state", &Value::from("killed"), &line["state"]);
    let elapsed = line["elapsed_s"].as_f64().unwrap_or(0.0);
    list.ensure(
        "runs gives the time it ran until killed",
        elapsed > ran - 1.5 && elapsed <= ran + 0.5,
        &format!("about {ran:.1} s"),
        elapsed,
    );
    let text = oomguard(t.path(), &["runs"], None, QUICK);
    text.ensure(
        "the text line too, marked killed",
        text.stdout.contains("killed") && !text.stdout.contains(" 0.0 s "),
        "killed, not 0.0 s",
        &text.stdout,
    );
    let st = oomguard(t.path(), &["status"], None, QUICK);
    st.ensure(
        "status says until it was killed, and that attempt 3 was back",
        st.stdout.contains("until it was killed")
            && st
                .stdout
                .contains("attempt 3 is back at step 6, at a time not journaled"),
        "until it was killed; attempt 3 is back at step 6",
        &st.stdout,
    );
    drop(runs);
}
