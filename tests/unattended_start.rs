//! Unattended means unattended, at the start of a run: before the night begins,
//! oomguard says what it can change in the command and what it cannot (a shell
//! script it cannot see into, knobs it did not find), and what inside the command
//! restarts or resizes the run by itself (torchrun's `--max-restarts`, an
//! in-process batch-size finder). Every message that explains why it stopped is
//! complete at the default verbosity. Each test drives the real binary as a user does.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);
const REAL_LIMIT: Duration = Duration::from_secs(420);

/// A training script with a bare `--batch_size` that dies of an uncaught CUDA OOM
/// the way PyTorch prints it (`tests/children/traceback_oom.py`).
fn bs_script(dir: &Path) -> PathBuf {
    let p = dir.join("bs.py");
    let child = repo().join("tests/children/traceback_oom.py");
    std::fs::write(
        &p,
        format!(
            "import runpy, sys\nsys.argv = [{child:?}, 'torch', 'exit']\nrunpy.run_path({child:?}, run_name='__main__')\n",
            child = child.display().to_string()
        ),
    )
    .unwrap();
    p
}

/// The lines oomguard printed, in order, as `oomguard: ...` text.
fn position(run: &Run, needle: &str) -> usize {
    run.stderr.find(needle).unwrap_or_else(|| {
        run.fail(
            "a line on oomguard's stderr",
            needle,
            "no such line (stderr is shown below)",
        )
    })
}

/// The user's case: `oomguard python bs.py --batch_size 32`. Before anything runs it
/// says that it found nothing it can change (a bare `--batch_size` is not guessed) and
/// how to bind it; when the OOM comes it stops with exit 75, says so without an empty
/// settings list, and prints the notes it refers to, all without `-v`.
#[test]
fn a_command_with_nothing_to_change_says_so_at_the_start_and_when_it_stops() {
    let tmp = tempfile::tempdir().unwrap();
    bs_script(tmp.path());
    let run = oomguard(
        tmp.path(),
        &["--run-dir", "run", "python3", "bs.py", "--batch_size", "32"],
        None,
        LIMIT,
    );
    run.check("exit code", Some(75), run.code);
    let warning = position(
        &run,
        "oomguard: warning: oomguard found no setting it can change after a GPU OOM in this command: an OOM ends the run (exit 75) instead of a relaunch; `oomguard plan python3 bs.py --batch_size 32` shows where it looked",
    );
    let can = position(
        &run,
        "oomguard: can change: nothing; cannot change (not found in the command): micro_batch, grad_accum, seq_len, grad_checkpointing, zero_stage, offload_optimizer, offload_param, dataloader_workers",
    );
    let oom = position(&run, "torch.OutOfMemoryError: CUDA out of memory");
    run.ensure(
        "what oomguard can change is said before the command runs",
        warning < oom && can < oom,
        "the warning and the can-change line before the command's output",
        &run.stderr,
    );
    // How to bind the bare --batch_size, on the warning line itself.
    position(
        &run,
        "If it is the per-device micro-batch: --knob micro_batch=--batch_size",
    );
    let stop = position(
        &run,
        "oomguard: the policy 'default' has no step left; the run still does not fit as written: oomguard found no setting it can change in this command\n",
    );
    run.ensure(
        "no empty settings list",
        !run.stderr.contains("does not fit at \n"),
        "no 'does not fit at ' with nothing after it",
        &run.stderr,
    );
    // The notes the not-applicable steps refer to are printed, after the stop line.
    let note = position(
        &run,
        "oomguard:   micro_batch: --batch_size may be the global batch or the per-device micro-batch, so oomguard does not guess. If it is the per-device micro-batch: --knob micro_batch=--batch_size\n",
    );
    position(
        &run,
        "oomguard:   grad_accum: not found; the global batch cannot be kept when the micro-batch is halved.",
    );
    let plan = position(
        &run,
        "oomguard:   `oomguard plan python3 bs.py --batch_size 32` shows every knob, where oomguard looked for it and the ladder\n",
    );
    run.ensure(
        "the stop block is complete and in order",
        stop < note && note < plan,
        "stop line, then the notes, then the plan hint",
        &run.stderr,
    );
    let j = run.journal(&tmp.path().join("run"));
    run.check("attempts", 1, events(&j, "attempt_start").len());
    run.check("decisions", 0, events(&j, "decision").len());
}

/// `oomguard ./run.sh` and `oomguard bash run.sh`: the shell script is named as such at
/// the start (oomguard cannot see inside it; what to do instead), and again when the
/// run stops for want of anything to change.
#[test]
fn a_shell_script_in_front_of_the_command_is_named_at_the_start_and_at_the_stop() {
    let tmp = tempfile::tempdir().unwrap();
    bs_script(tmp.path());
    let script = tmp.path().join("run.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nexec python3 bs.py --batch_size 32 \"$@\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (args, shown) in [
        (&["./run.sh"][..], "./run.sh"),
        (&["bash", "run.sh"][..], "bash run.sh"),
    ] {
        let run_dir = format!("run-{}", shown.replace(['/', ' ', '.'], "_"));
        let mut all = vec!["--run-dir", run_dir.as_str()];
        all.extend_from_slice(args);
        let run = oomguard(tmp.path(), &all, None, LIMIT);
        run.check("exit code", Some(75), run.code);
        let said = format!(
            "{shown} is a shell script: oomguard cannot see or change the settings of the command inside it. Put oomguard in front of the real training command (in the script: `oomguard torchrun train.py ...`), or tell it where a setting lives with --knob (an environment variable the script reads: --knob micro_batch=env:MICRO_BS; a flag the script passes on with \"$@\": --knob micro_batch=--per_device_train_batch_size=8)"
        );
        let start = position(&run, &format!("oomguard: warning: {said}\n"));
        let oom = position(&run, "torch.OutOfMemoryError: CUDA out of memory");
        let stop = position(&run, "the run still does not fit as written");
        let again = position(&run, &format!("oomguard:   {said}\n"));
        run.ensure(
            "the script is named before the command runs and again at the stop",
            start < oom && stop < again,
            "warning before the OOM; the same advice after the stop line",
            &run.stderr,
        );
    }
}

/// `plan` (text and `--json` notes) says what restarts or resizes the run inside the
/// command: torchrun's `--max_restarts` (either spelling), the Trainer's
/// `--auto_find_batch_size`, a script that calls Accelerate's `find_executable_batch_size`.
#[test]
fn plan_says_what_restarts_or_resizes_the_run_inside_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("train.py"),
        "from accelerate.utils import find_executable_batch_size\n\n@find_executable_batch_size(starting_batch_size=64)\ndef loop(batch_size):\n    pass\n",
    )
    .unwrap();
    let restarts = "torchrun restarts failed workers itself (--max-restarts 2): its restarts belong to one attempt of oomguard's, and after a GPU OOM oomguard stops torchrun at once, so the settings that ran out are not re-run 2 more times before oomguard decides, once (other failures are still torchrun's to restart)";
    let finder = "--auto_find_batch_size: the Trainer halves the batch inside the process after each OOM it catches, without raising the accumulation: the global batch is the finder's, not oomguard's. oomguard never acts on an OOM the finder catches; it relaunches only when the process dies of one (the finder then starts from oomguard's smaller micro-batch)";
    let command = [
        "torchrun",
        "--nproc_per_node",
        "2",
        "--max_restarts=2",
        "train.py",
        "--per_device_train_batch_size",
        "8",
        "--auto_find_batch_size",
    ];
    let mut args = vec!["plan", "--json"];
    args.extend_from_slice(&command);
    let run = oomguard(tmp.path(), &args, None, LIMIT);
    run.check("exit code", Some(0), run.code);
    let json: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| {
        run.fail(
            "plan --json",
            "one JSON object",
            &format!("{e}: {}", run.stdout),
        )
    });
    let notes: Vec<&str> = json["notes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    run.ensure(
        "torchrun's restarts in the notes",
        notes.contains(&restarts),
        restarts,
        &notes,
    );
    run.ensure(
        "the finder in the notes",
        notes.contains(&finder),
        finder,
        &notes,
    );

    let mut args = vec!["plan"];
    args.extend_from_slice(&command);
    let text = oomguard(tmp.path(), &args, None, LIMIT);
    text.check("exit code", Some(0), text.code);
    for n in [restarts, finder] {
        text.ensure(
            "plan's text notes",
            text.stdout.contains(&format!("  - {n}\n")),
            n,
            &text.stdout,
        );
    }

    // Without the flag, the script's own finder is found.
    let run = oomguard(
        tmp.path(),
        &[
            "plan",
            "python3",
            "train.py",
            "--per_device_train_batch_size",
            "8",
        ],
        None,
        LIMIT,
    );
    run.check("exit code", Some(0), run.code);
    let script = "train.py finds its batch size itself (find_executable_batch_size): it halves the batch inside the process after each OOM it catches, without raising the accumulation: the global batch is the finder's, not oomguard's.";
    run.ensure(
        "the script's finder",
        run.stdout.contains(script),
        script,
        &run.stdout,
    );
}

/// Real torchrun with `--max-restarts 2`: the first launch fails of something else
/// (torchrun restarts its workers, as asked), the restarted workers die of an OOM. That
/// is one attempt of oomguard's: it stops torchrun before it re-runs the settings that
/// ran out, decides once, and the second attempt fits. Rank 1 is launched 3 times in
/// all (not 1 + 2 restarts of the OOMing settings + 1), and the journal counts
/// torchrun's restart within attempt 1.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn torchrun_restarts_belong_to_one_attempt_and_an_oom_is_not_rerun_by_them() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let launches = tmp.path().join("launches.txt");
    let run_dir = tmp.path().join("run");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "torchrun",
        "--standalone",
        "--nproc_per_node=2",
        "--max-restarts",
        "2",
        "tests/real/torchrun_restarts.py",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
        "--budget",
        "4",
        "--launches",
        launches.to_str().unwrap(),
        "--flaky_first_launch",
    ];
    let run = oomguard(&repo(), &args, Some(&bin), REAL_LIMIT);
    run.check("exit code", Some(0), run.code);
    let start = position(
        &run,
        "oomguard: note: torchrun restarts failed workers itself (--max-restarts 2): its restarts belong to one attempt of oomguard's, and after a GPU OOM oomguard stops torchrun at once",
    );
    // torchrun's banner (on stderr) comes when it starts the workers.
    let first = position(&run, "Setting OMP_NUM_THREADS");
    run.ensure(
        "said at the start",
        start < first,
        "the note before torchrun starts",
        &run.stderr,
    );
    position(
        &run,
        "oomguard: attempt 1: a torchrun worker died of a GPU OOM: stopped torchrun before its --max-restarts 2 re-ran the same settings\n",
    );
    position(
        &run,
        "oomguard: attempt 1: torchrun restarted its workers 1 time within this attempt (--max-restarts 2)\n",
    );
    let text = std::fs::read_to_string(&launches).unwrap_or_default();
    let rank1: Vec<&str> = text.lines().filter(|l| l.starts_with("rank=1 ")).collect();
    run.check(
        "rank 1's launches: the flaky one, the OOM, the relaunch that fits",
        vec![
            "rank=1 micro=8 accum=1",
            "rank=1 micro=8 accum=1",
            "rank=1 micro=4 accum=2",
        ],
        rank1,
    );
    run.ensure(
        "global batch kept",
        run.stdout.contains("training finished: global_batch=16"),
        "training finished: global_batch=16",
        &run.stdout,
    );
    let j = run.journal(&run_dir);
    let decisions: Vec<_> = events(&j, "decision")
        .iter()
        .map(|d| d["step"].clone())
        .collect();
    run.check(
        "decisions",
        vec![Value::from("halve_micro_batch")],
        decisions,
    );
    let ends = events(&j, "attempt_end");
    let outcomes: Vec<_> = ends.iter().map(|e| e["outcome"].clone()).collect();
    run.check(
        "attempts",
        vec![Value::from("cuda_oom"), Value::from("success")],
        outcomes,
    );
    run.check(
        "torchrun's restarts in attempt 1",
        serde_json::json!({"max_restarts": 2, "restarts": 1, "stopped_at_oom": true}),
        ends[0]["torchrun"].clone(),
    );
    run.check(
        "torchrun's restarts in attempt 2",
        serde_json::json!({"max_restarts": 2, "restarts": 0, "stopped_at_oom": false}),
        ends[1]["torchrun"].clone(),
    );
    expect_no_survivors(&run, launches.to_str().unwrap());
}

/// A real Trainer with `--auto_find_batch_size`: its finder catches the OOM at
/// micro-batch 8 and trains at 4. oomguard says at the start that the global batch is
/// the finder's, and never fights it: one attempt, no decision, exit 0.
#[test]
#[ignore = "needs the real-client venv: run bash tests/run.sh"]
fn an_in_process_batch_size_finder_is_named_and_never_fought() {
    let bin = venv_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (out, run_dir) = (tmp.path().join("out"), tmp.path().join("run"));
    let report = tmp.path().join("report.jsonl");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "python",
        "tests/real/hf_trainer_oom.py",
        "--per_device_train_batch_size",
        "8",
        "--max_seq_length",
        "64",
        "--budget",
        "256",
        "--max_steps",
        "3",
        "--auto_find_batch_size",
        "--output_dir",
        out.to_str().unwrap(),
        "--oomguard_report",
        report.to_str().unwrap(),
    ];
    let run = oomguard(&repo(), &args, Some(&bin), REAL_LIMIT);
    run.check("exit code", Some(0), run.code);
    position(
        &run,
        "oomguard: note: --auto_find_batch_size: the Trainer halves the batch inside the process after each OOM it catches, without raising the accumulation: the global batch is the finder's, not oomguard's. oomguard never acts on an OOM the finder catches",
    );
    let j = run.journal(&run_dir);
    run.check("attempts", 1, events(&j, "attempt_start").len());
    run.check("decisions", 0, events(&j, "decision").len());
    let lines = std::fs::read_to_string(&report).unwrap_or_default();
    run.check("the Trainer finished once", 1, lines.lines().count());
}

/// A recipe that turns the Trainer's saves off (`save_strategy: "no"` in a TRL
/// recipe, YAML 1.1's bare `no` in an axolotl config) is warned before the run, as
/// `--save_strategy no` is: after an OOM each relaunch starts from the beginning.
#[test]
fn a_recipe_that_saves_nothing_is_warned_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("sft.py"), "from trl import SFTConfig, TrlParser\n").unwrap();
    let plan = |args: &[&str]| {
        let mut all = vec!["plan"];
        all.extend_from_slice(args);
        let r = oomguard(d, &all, None, LIMIT);
        r.check("plan exit code", Some(0), r.code);
        r
    };
    let warned = |r: &Run| {
        r.stdout
            .contains("the Trainer saves no checkpoint while it trains (save_strategy: no in its recipe): after an OOM each relaunch starts from the beginning")
    };
    for (file, text, argv) in [
        (
            "recipe.yaml",
            "per_device_train_batch_size: 4\noutput_dir: out\nsave_strategy: \"no\"\n",
            &["accelerate", "launch", "sft.py", "--config", "recipe.yaml"][..],
        ),
        (
            "ax.yml",
            "base_model: m\nmicro_batch_size: 4\noutput_dir: out\nsave_strategy: no\n",
            &["axolotl", "train", "ax.yml"][..],
        ),
    ] {
        std::fs::write(d.join(file), text).unwrap();
        let r = plan(argv);
        r.ensure(
            "the warning, naming the recipe's key",
            warned(&r),
            "save_strategy: no in its recipe",
            &r.stdout,
        );
        std::fs::write(
            d.join(file),
            text.replace("\"no\"", "steps").replace(": no", ": steps"),
        )
        .unwrap();
        let r = plan(argv);
        r.ensure(
            "no warning for a recipe that saves",
            !warned(&r) && !r.stdout.contains("saves no checkpoint"),
            "no warning",
            &r.stdout,
        );
    }
}
