//! A process of the run that dies of SIGKILL is checked against the kernel's OOM-killer
//! record, through the real binary:
//!
//! - live: a memory cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes`) that a worker
//!   of the run moves itself into and then allocates past; the kernel's OOM killer kills
//!   it and oomguard must name it (PID, name, anon-rss). This needs root (to make the
//!   cgroup and to read the kernel's log); where the machine does not allow it, the test
//!   fails and says why;
//! - faked: `OOMGUARD_FAKE_KERNEL_LOG=FILE` stands for the kernel's log, so the three
//!   answers (the OOM killer's victim, a SIGKILL from someone else, an unreadable log) are
//!   checked on any machine.

mod common;
use common::OOMGUARD;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// `oomguard ARGS` in `cwd` with `env` added; on failure the caller prints `describe`.
fn oomguard(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(OOMGUARD);
    c.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .env_remove("OOMGUARD_FAKE_KERNEL_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run oomguard")
}

fn describe(cwd: &Path, args: &[&str], env: &[(&str, &str)], out: &Output) -> String {
    format!(
        "command: {} {OOMGUARD} {}\ncwd: {}\nstatus: {}\nstdout: {}\nstderr: {}",
        env.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        args.join(" "),
        cwd.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `attempt_end` events of the run folder's journal.
fn attempt_ends(run_dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(run_dir.join("journal.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "attempt_end")
        .collect()
}

/// A command that writes the kernel's record of its own OOM kill (when `record`), then
/// dies of SIGKILL without a word.
fn self_killing(fake_log: &Path, record: bool) -> Vec<String> {
    let write = if record {
        format!(
            "echo \"[ 9999999.000000] Out of memory: Killed process $$ (sh) total-vm:9000kB, anon-rss:3145728kB, file-rss:0kB, shmem-rss:0kB, UID:0\" > '{}'; ",
            fake_log.display()
        )
    } else {
        String::new()
    };
    vec!["sh".into(), "-c".into(), format!("{write}kill -9 $$")]
}

#[test]
fn a_sigkill_is_named_a_host_oom_only_when_the_kernels_record_names_a_process_of_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("kmsg.txt");
    let fake_s = fake.to_str().unwrap();
    let env = [("OOMGUARD_FAKE_KERNEL_LOG", fake_s)];

    // The kernel's OOM killer killed the command itself.
    std::fs::write(&fake, "").unwrap();
    let run_dir = tmp.path().join("run-oom");
    let cmd = self_killing(&fake, true);
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap(), "--"];
    args.extend(cmd.iter().map(String::as_str));
    let out = oomguard(tmp.path(), &args, &env);
    let err = String::from_utf8_lossy(&out.stderr);
    let why = describe(tmp.path(), &args, &env, &out);
    assert_eq!(out.status.code(), Some(137), "{why}");
    assert!(
        err.contains("the kernel's OOM killer killed pid ")
            && err.contains("(sh), anon-rss 3.00 GiB"),
        "{why}"
    );
    let ends = attempt_ends(&run_dir);
    assert_eq!(ends.len(), 1, "one attempt, never relaunched\n{why}");
    assert_eq!(ends[0]["outcome"], "host_oom", "{why}");
    let victim = &ends[0]["kernel_oom_kill"];
    assert_eq!(victim["name"], "sh", "{why}");
    assert_eq!(victim["anon_rss_bytes"], 3u64 << 30, "{why}");
    assert!(victim["pid"].as_u64().is_some_and(|p| p > 1), "{why}");

    // Killed by SIGKILL, and the kernel's log has no record of it.
    std::fs::write(&fake, "[    1.000000] Linux version 6.1\n").unwrap();
    let run_dir = tmp.path().join("run-kill");
    let cmd = self_killing(&fake, false);
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap(), "--"];
    args.extend(cmd.iter().map(String::as_str));
    let out = oomguard(tmp.path(), &args, &env);
    let err = String::from_utf8_lossy(&out.stderr);
    let why = describe(tmp.path(), &args, &env, &out);
    assert_eq!(out.status.code(), Some(137), "{why}");
    assert!(
        err.contains("killed by SIGKILL (not by the OOM killer"),
        "{why}"
    );
    let ends = attempt_ends(&run_dir);
    assert_eq!(ends[0]["outcome"], "other_failure", "{why}");
    assert!(
        ends[0]["why"]
            .as_str()
            .is_some_and(|w| w.contains("not by the OOM killer")),
        "{why}"
    );

    // The kernel's log cannot be read: said once, and the kill is taken for a host OOM.
    let missing = tmp.path().join("no-such-kmsg");
    let env = [("OOMGUARD_FAKE_KERNEL_LOG", missing.to_str().unwrap())];
    let run_dir = tmp.path().join("run-unread");
    let mut args = vec!["--run-dir", run_dir.to_str().unwrap(), "--"];
    args.extend(cmd.iter().map(String::as_str));
    let out = oomguard(tmp.path(), &args, &env);
    let err = String::from_utf8_lossy(&out.stderr);
    let why = describe(tmp.path(), &args, &env, &out);
    assert_eq!(out.status.code(), Some(137), "{why}");
    assert_eq!(
        err.matches("cannot read the kernel's log").count(),
        1,
        "{why}"
    );
    assert!(
        err.contains("could not be read to confirm the OOM killer"),
        "{why}"
    );
    assert_eq!(attempt_ends(&run_dir)[0]["outcome"], "host_oom", "{why}");
}

#[test]
fn diagnose_reads_a_pasted_kernel_log_with_the_run_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("train.log");
    let kmsg = tmp.path().join("dmesg.txt");
    std::fs::write(
        &log,
        "step 10 loss 0.3\nE0612 12:00:00.000000 1 api.py:881] failed (exitcode: -9) local_rank: 0 (pid: 3309) of binary: python\n",
    )
    .unwrap();
    std::fs::write(
        &kmsg,
        "[ 812.1] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=python,pid=3309,uid=1000\n[ 812.2] Out of memory: Killed process 3309 (python) total-vm:90000000kB, anon-rss:62914560kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:1kB oom_score_adj:0\n",
    )
    .unwrap();
    let args = [
        "diagnose",
        "--json",
        "--kernel-log",
        kmsg.to_str().unwrap(),
        log.to_str().unwrap(),
    ];
    let out = oomguard(tmp.path(), &args, &[]);
    let why = describe(tmp.path(), &args, &[], &out);
    assert_eq!(out.status.code(), Some(0), "{why}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["kind"], "host_oom", "{why}");
    assert_eq!(v["victim"]["pid"], 3309, "{why}");
    assert_eq!(v["victim"]["anon_rss_bytes"], 60u64 << 30, "{why}");
    assert_eq!(v["victim"]["constraint"], "CONSTRAINT_NONE", "{why}");

    // The same kill with a kernel log that names another process: not the OOM killer's.
    std::fs::write(
        &kmsg,
        "[ 812.2] Out of memory: Killed process 4444 (Xorg) total-vm:1kB, anon-rss:1kB\n",
    )
    .unwrap();
    let out = oomguard(tmp.path(), &args, &[]);
    let why = describe(tmp.path(), &args, &[], &out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["kind"], "other_failure", "{why}");
    assert!(
        v["note"]
            .as_str()
            .is_some_and(|n| n.contains("not by the OOM killer")),
        "{why}"
    );

    // A dmesg excerpt pasted as the log itself classifies too.
    let args = ["diagnose", "--json", kmsg.to_str().unwrap()];
    let out = oomguard(tmp.path(), &args, &[]);
    let why = describe(tmp.path(), &args, &[], &out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (v["kind"].as_str(), v["victim"]["pid"].as_u64()),
        (Some("host_oom"), Some(4444)),
        "{why}"
    );
}

/// A memory cgroup made for one test and removed after it.
struct Cgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl Cgroup {
    /// A fresh cgroup limited to `bytes`, v2 where the memory controller is there, else v1.
    fn limited(bytes: u64) -> Result<Cgroup, String> {
        let name = format!("oomguard-test-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup");
        let v2_ok = std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
        let mut why = Vec::new();
        if v2_ok {
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
            match Self::make(
                &v2.join(&name),
                &[("memory.max", bytes), ("memory.swap.max", 0)],
                "cgroup.procs",
            ) {
                Ok(cg) => return Ok(cg),
                Err(e) => why.push(format!("cgroup v2: {e}")),
            }
        } else {
            why.push("cgroup v2: no memory controller in /sys/fs/cgroup".into());
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        match Self::make(
            &v1.join(&name),
            &[("memory.limit_in_bytes", bytes)],
            "cgroup.procs",
        ) {
            Ok(cg) => {
                // Without swap accounting the file is absent: nothing to limit there.
                let _ = std::fs::write(
                    cg.dir.join("memory.memsw.limit_in_bytes"),
                    bytes.to_string(),
                );
                Ok(cg)
            }
            Err(e) => {
                why.push(format!("cgroup v1: {e}"));
                Err(why.join("; "))
            }
        }
    }

    fn make(dir: &Path, limits: &[(&str, u64)], procs: &str) -> Result<Cgroup, String> {
        std::fs::create_dir(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = Cgroup {
            dir: dir.to_path_buf(),
            procs: dir.join(procs),
        };
        for (file, value) in limits {
            let path = dir.join(file);
            if let Err(e) = std::fs::write(&path, value.to_string())
                && *file != "memory.swap.max"
            {
                return Err(format!("{}: {e}", path.display()));
            }
        }
        Ok(cg)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once its processes are gone (reaped); retry a little while they go.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// Why the live test cannot run here, if it cannot.
fn live_test_unavailable() -> Option<String> {
    let mut kmsg = [0u8; 8192];
    use std::io::Read;
    let readable = std::fs::File::open("/dev/kmsg")
        .and_then(|mut f| f.read(&mut kmsg))
        .is_ok()
        || Command::new("dmesg")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    (!readable)
        .then(|| "the kernel's log is not readable here (not root, or dmesg_restrict)".into())
}

/// A test that cannot run fails and says why: it never passes without checking.
fn skip(why: &str) {
    panic!(
        "the live kernel OOM test cannot run here: {why} (it needs root, a memory cgroup it can create and a readable kernel log)"
    );
}

#[test]
fn a_worker_the_kernels_oom_killer_kills_in_a_memory_cgroup_is_named() {
    if let Some(why) = live_test_unavailable() {
        return skip(&why);
    }
    let cg = match Cgroup::limited(64 << 20) {
        Ok(cg) => cg,
        Err(why) => return skip(&format!("cannot make a memory cgroup: {why}")),
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/oom_in_cgroup.py");
    let tmp = tempfile::tempdir().unwrap();
    for (mode, status) in [("worker", 1), ("self", 137)] {
        let run_dir = tmp.path().join(format!("run-{mode}"));
        let args = [
            "--run-dir",
            run_dir.to_str().unwrap(),
            "python3",
            script.to_str().unwrap(),
            cg.procs.to_str().unwrap(),
            mode,
        ];
        let out = oomguard(tmp.path(), &args, &[]);
        let why = describe(tmp.path(), &args, &[], &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        let pid: u64 = stdout
            .split("allocating (pid: ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the process never said its pid\n{why}"));
        assert_eq!(
            out.status.code(),
            Some(status),
            "{mode}: the command's status\n{why}"
        );
        assert!(
            err.contains(&format!(
                "the kernel's OOM killer killed pid {pid} (python3), anon-rss "
            )),
            "{mode}: oomguard names the victim\n{why}"
        );
        let ends = attempt_ends(&run_dir);
        assert_eq!(ends.len(), 1, "{mode}: never relaunched\n{why}");
        assert_eq!(ends[0]["outcome"], "host_oom", "{mode}\n{why}");
        let victim = &ends[0]["kernel_oom_kill"];
        assert_eq!(victim["pid"].as_u64(), Some(pid), "{mode}\n{why}");
        assert_eq!(victim["constraint"], "CONSTRAINT_MEMCG", "{mode}\n{why}");
        // It had allocated about as much as the cgroup allows: 64 MiB (the
        // interpreter's own memory is part of it).
        let rss = victim["anon_rss_bytes"].as_u64().unwrap_or(0);
        assert!(
            (32 << 20..=80 << 20).contains(&rss),
            "{mode}: anon-rss {rss}\n{why}"
        );
    }
}
