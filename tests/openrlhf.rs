//! OpenRLHF, as its example scripts run it: the trainer's own argparse options, in the
//! dotted spelling of 2026 (`--train.micro_batch_size`) and the one before
//! (`--micro_train_batch_size`). `tests/children/openrlhf/cli/train_sft.py` parses them
//! as OpenRLHF does (store_true switches, accumulation derived from the global batch),
//! saves DeepSpeed checkpoints (`global_stepN/`, `latest`) and dies of an OOM as PyTorch
//! prints it while its micro-batch is above 1 without checkpointing. Needs `python3`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{argv_of, events, flag_value, oomguard, repo};

const LIMIT: Duration = Duration::from_secs(120);

/// One run of the simulated trainer under oomguard, flags spelled `dotted` or not:
/// a checkpoint at step 2, the OOM at step 3, micro-batch 4 of a global batch of 64.
fn carried_through(dotted: bool) {
    let dir = tempfile::tempdir().unwrap();
    let script = repo().join("tests/children/openrlhf/cli/train_sft.py");
    let run_dir = dir.path().join("run");
    let f = |new: &'static str, old: &'static str| if dotted { new } else { old };
    let (micro, batch, path, save, load, adam) = (
        f("--train.micro_batch_size", "--micro_train_batch_size"),
        f("--train.batch_size", "--train_batch_size"),
        f("--ckpt.path", "--ckpt_path"),
        f("--ckpt.save_steps", "--save_steps"),
        f("--ckpt.load_enable", "--load_checkpoint"),
        f("--ds.adam_offload", "--adam_offload"),
    );
    let command = ["python3", script.to_str().unwrap(), micro, "4", batch, "64"];
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap()];
    args.extend(command);
    args.extend([path, "ck", save, "2"]);
    let r = oomguard(dir.path(), &args, None, LIMIT);
    r.check("exit code", Some(0), r.code);
    let j = r.journal(&run_dir);
    let argvs: Vec<Vec<String>> = events(&j, "attempt_start")
        .into_iter()
        .map(argv_of)
        .collect();
    let micros: Vec<Option<String>> = argvs.iter().map(|a| flag_value(a, micro)).collect();
    r.check(
        "the micro-batch of each attempt",
        vec![Some("4".into()), Some("2".into()), Some("1".into())],
        micros,
    );
    for a in &argvs[1..] {
        r.ensure(
            "each relaunch keeps the global batch flag and adds the checkpoint switch bare",
            flag_value(a, batch).as_deref() == Some("64")
                && a.iter().filter(|w| *w == load).count() == 1
                && !a.iter().any(|w| w.starts_with("--gradient_accumulation")),
            &format!("{batch} 64 and {load}, no accumulation flag"),
            a,
        );
    }
    r.ensure(
        "the first attempt runs as given",
        !argvs[0].iter().any(|w| w == load),
        "no switch",
        &argvs[0],
    );
    r.ensure(
        "the relaunches load the run's checkpoint and finish at the same global batch",
        r.stdout
            .matches("Loaded the checkpoint: ck/global_step2")
            .count()
            == 2
            && r.stdout
                .contains("micro 1, accumulation 64, global batch 64")
            && r.stdout.contains("global_step 6")
            && r.stdout.contains("training done"),
        "two loads of ck/global_step2, then steps 3 to 6 at micro 1 × 64",
        &r.stdout,
    );
    r.ensure(
        "the summary's rerun line carries the switch",
        r.stderr
            .contains(&format!("{micro} 1 {batch} 64 {path} ck {save} 2 {load}")),
        "the settings that fit, with the switch",
        &r.stderr,
    );
    let plan = oomguard(dir.path(), &[&["plan"][..], &command].concat(), None, LIMIT);
    plan.ensure(
        "plan names the default checkpoint folder and the derived accumulation",
        plan.stdout
            .contains("deepspeed latest → global_stepN in ./ckpt/checkpoints_sft")
            && plan
                .stdout
                .contains(&format!("derived: {batch} 64 / micro-batch / world size")),
        "the layout and the derivation",
        &plan.stdout,
    );
    plan.ensure(
        "its optimizer offload switch is a rung, added bare in the command's spelling",
        plan.stdout.lines().any(|l| {
            l.starts_with("  offload_optimizer ") && l.contains(&format!("would add {adam}"))
        }) && plan
            .stdout
            .contains("offload_optimizer (offload_optimizer none → cpu)")
            && plan
                .stdout
                .lines()
                .any(|l| l.contains("argv:") && l.ends_with(&format!(" {adam}"))),
        &format!("offload_optimizer none absent; would add {adam}, and a rung ending with it"),
        &plan.stdout,
    );
    assert!(Path::new(&dir.path().join("ck/latest")).exists());
}

#[test]
fn an_oom_in_an_openrlhf_run_halves_its_micro_batch_and_resumes_with_its_switch() {
    carried_through(true);
}

#[test]
fn the_same_with_the_flags_spelled_before_2026() {
    carried_through(false);
}
