//! Trust, through the real binary: oomguard never hurts a file it does not own.
//! Run folders are created fresh and private and nothing in them follows a planted
//! link; two runs never share one; `--edit-in-place` edits are atomic, locked per
//! module, checked before anything runs, and undone only where oomguard's own
//! record (absolute paths, content hashes) says they are its own; a user's edit of
//! a config during a run is reported. Every wait polls with a deadline.

mod common;
use common::OOMGUARD;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

const OOM_LINE: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is free.";

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

type Buf = Arc<Mutex<Vec<u8>>>;

/// A running oomguard whose stdout and stderr are collected as they come.
struct Og {
    child: Child,
    shown: String,
    cwd: PathBuf,
    out: Buf,
    err: Buf,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Options of one oomguard start.
#[derive(Default)]
struct Opts<'a> {
    envs: &'a [(&'a str, &'a str)],
    /// RLIMIT_FSIZE for oomguard (and so its command), with SIGXFSZ ignored: every write
    /// past this size fails with EFBIG, the way a full disk fails a write with ENOSPC.
    file_size_limit: Option<u64>,
}

impl Og {
    fn start(cwd: &Path, args: &[&str], opts: Opts) -> Og {
        let mut cmd = Command::new(OOMGUARD);
        cmd.args(args).current_dir(cwd).stdin(Stdio::null());
        cmd.env("PYTHONDONTWRITEBYTECODE", "1");
        for (k, v) in opts.envs {
            cmd.env(k, v);
        }
        if let Some(limit) = opts.file_size_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit and signal are async-signal-safe and touch only the child.
            unsafe {
                cmd.pre_exec(move || {
                    let r = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
        let (out, err): (Buf, Buf) = Default::default();
        let mut readers = Vec::new();
        for (mut r, buf) in [
            (
                Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
                Arc::clone(&out),
            ),
            (Box::new(child.stderr.take().unwrap()), Arc::clone(&err)),
        ] {
            readers.push(std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    buf.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            }));
        }
        Og {
            child,
            shown,
            cwd: cwd.to_path_buf(),
            out,
            err,
            readers,
        }
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }

    fn fail(&self, expected: &str) -> ! {
        panic!(
            "\n=== expected: {expected}\ncommand: {}\ncwd: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.shown,
            self.cwd.display(),
            self.stdout(),
            self.stderr()
        )
    }

    fn wait_stdout(&self, needle: &str) {
        if !common::wait_until(Duration::from_secs(60), || self.stdout().contains(needle)) {
            self.fail(&format!("stdout containing {needle:?} within 60 s"));
        }
    }

    /// Wait for the exit (60 s at most) and for the output to be read.
    fn wait(&mut self) -> i32 {
        let mut status = None;
        if !common::wait_until(Duration::from_secs(60), || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        }) {
            self.fail("oomguard to exit within 60 s");
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        status.unwrap().code().unwrap_or(-1)
    }

    fn expect(&mut self, code: i32, stderr_has: &[&str]) {
        let got = self.wait();
        if got != code {
            self.fail(&format!("exit code {code}, found {got}"));
        }
        let err = self.stderr();
        for s in stderr_has {
            if !err.contains(s) {
                self.fail(&format!("stderr containing {s:?}"));
            }
        }
    }
}

impl Drop for Og {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn journal(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn events<'a>(j: &'a [Value], name: &str) -> Vec<&'a Value> {
    j.iter().filter(|e| e["event"] == name).collect()
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const DS_JSON: &str =
    "{\n  \"train_micro_batch_size_per_gpu\": 8,\n  \"gradient_accumulation_steps\": 1\n}\n";

/// A trainer named by `--deepspeed ds.json`: prints its argv; OOMs the first time (no
/// `flag` file yet). With `go`, it first waits for that file to exist.
fn ds_trainer(flag: &Path, go: Option<&Path>) -> String {
    let wait = match go {
        Some(g) => format!("import time\nwhile not os.path.exists({g:?}):\n    time.sleep(0.02)\n"),
        None => String::new(),
    };
    format!(
        "import os,sys,stat\n{wait}print('argv', ' '.join(sys.argv[1:]), flush=True)\n\
         a=sys.argv[1:]\nd=os.path.dirname(a[a.index('--deepspeed')+1]) if '--deepspeed' in a else ''\n\
         while d not in ('', '/'):\n    st=os.lstat(d)\n    print('folder', d, oct(stat.S_IMODE(st.st_mode)), int(stat.S_ISLNK(st.st_mode)), flush=True)\n    d=os.path.dirname(d)\n\
         f={flag:?}\nif not os.path.exists(f):\n    open(f,'w').close(); sys.stderr.write('{OOM_LINE}\\n'); sys.exit(1)\nprint('finished', flush=True)\n"
    )
}

/// The `--deepspeed` path the last attempt was given, from the trainer's `argv` lines.
fn ds_copy(stdout: &str) -> Option<PathBuf> {
    let line = stdout.lines().rfind(|l| l.starts_with("argv "))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == "--deepspeed")?;
    words.next().map(PathBuf::from)
}

/// A folder above the `--deepspeed` path as the trainer saw it while it ran (oomguard
/// removes its fallback folder when the run ends): its mode, and whether it was a link.
fn seen_folder(stdout: &str, folder: &Path) -> Option<(u32, bool)> {
    let want = folder.to_str()?;
    stdout.lines().rev().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == "folder" && w.next()? == want).then_some(())?;
        let mode = u32::from_str_radix(w.next()?.trim_start_matches("0o"), 8).ok()?;
        Some((mode, w.next()? == "1"))
    })
}

// ------------------------------------------------------------------- run folders

#[test]
fn a_planted_symlink_in_an_existing_run_folder_is_replaced_never_followed() {
    let t = tmp();
    let dir = t.path();
    std::fs::write(dir.join("ds.json"), DS_JSON).unwrap();
    // The victim's files, and a run folder (private, the user's) with links planted in it:
    // the first attempt's log, the second attempt's whole folder, the journal.
    let victim = dir.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("bashrc"), "precious\n").unwrap();
    std::fs::write(victim.join("journal"), "precious\n").unwrap();
    let run = dir.join("run");
    std::fs::create_dir_all(run.join("attempt-1")).unwrap();
    chmod(&run, 0o700);
    chmod(&run.join("attempt-1"), 0o700);
    std::os::unix::fs::symlink(victim.join("bashrc"), run.join("attempt-1/output.log")).unwrap();
    std::os::unix::fs::symlink(victim.join("journal"), run.join("journal.jsonl")).unwrap();
    std::os::unix::fs::symlink(&victim, run.join("attempt-2")).unwrap();
    let code = ds_trainer(&dir.join("flag"), None);
    let mut g = Og::start(
        dir,
        &[
            "--run-dir",
            "run",
            "python3",
            "-c",
            &code,
            "--deepspeed",
            "ds.json",
        ],
        Opts::default(),
    );
    let status = g.wait();
    if status != 0 || !g.stdout().contains("finished") {
        g.fail("exit 0 after one relaunch");
    }
    for f in ["bashrc", "journal"] {
        if read(&victim.join(f)) != "precious\n" {
            g.fail(&format!("victim/{f} untouched"));
        }
    }
    let names: Vec<_> = std::fs::read_dir(&victim)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    if names.len() != 2 {
        g.fail(&format!(
            "nothing written into the folder attempt-2 linked to, found {names:?}"
        ));
    }
    let copy = ds_copy(&g.stdout()).unwrap_or_else(|| g.fail("a --deepspeed copy"));
    if copy.starts_with(&victim)
        || seen_folder(&g.stdout(), copy.parent().unwrap()) != Some((0o700, false))
    {
        g.fail("the copy in a private folder of oomguard's own");
    }
}

#[test]
fn a_run_folder_owned_by_another_user_or_writable_by_others_is_refused_before_anything_runs() {
    let t = tmp();
    let dir = t.path();
    let ran = dir.join("ran");
    let code = format!("open({ran:?},'w').close()");
    let refused = |args: &[&str], why: &str| {
        let mut a = args.to_vec();
        a.extend(["python3", "-c", &code]);
        let mut g = Og::start(dir, &a, Opts::default());
        g.expect(2, &[why, "oomguard will not use it"]);
        if ran.exists() {
            g.fail("the command never started");
        }
    };
    // A --run-dir writable by others.
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    refused(&["--run-dir", "shared"], "writable by others");
    // .oomguard/runs writable by others (the default run folder goes in it).
    std::fs::create_dir_all(dir.join(".oomguard/runs")).unwrap();
    chmod(&dir.join(".oomguard"), 0o700);
    chmod(&dir.join(".oomguard/runs"), 0o777);
    refused(&[], "writable by others");
    // Owned by another user (root can give it away; others cannot make one).
    if nix::unistd::geteuid().is_root() {
        let theirs = dir.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        chmod(&theirs, 0o700);
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        refused(&["--run-dir", "theirs"], "owned by another user");
    }
    // A link in place of the run folder.
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("link")).unwrap();
    std::fs::create_dir(dir.join("elsewhere")).unwrap();
    refused(&["--run-dir", "link"], "symbolic link");
}

#[test]
fn without_a_writable_run_folder_config_copies_go_to_a_fresh_private_folder_not_a_predictable_one()
{
    let t = tmp();
    let dir = t.path();
    std::fs::write(dir.join("ds.json"), DS_JSON).unwrap();
    let tmpdir = dir.join("tmp");
    let attacker = dir.join("attacker");
    std::fs::create_dir(&tmpdir).unwrap();
    std::fs::create_dir(&attacker).unwrap();
    let go = dir.join("go");
    let code = ds_trainer(&dir.join("flag"), Some(&go));
    let tmp_s = tmpdir.to_str().unwrap().to_owned();
    let mut g = Og::start(
        dir,
        &[
            "--run-dir",
            "/proc/oomguard-cannot-write-here",
            "python3",
            "-c",
            &code,
            "--deepspeed",
            "ds.json",
        ],
        Opts {
            envs: &[("TMPDIR", &tmp_s)],
            ..Opts::default()
        },
    );
    // Another user who knows the pid plants the name the old fallback used.
    let pid = g.child.id();
    std::os::unix::fs::symlink(&attacker, tmpdir.join(format!("oomguard-{pid}"))).unwrap();
    std::fs::write(&go, "").unwrap();
    let status = g.wait();
    if status != 0 || !g.stdout().contains("finished") {
        g.fail("exit 0 after one relaunch, without a run folder");
    }
    if std::fs::read_dir(&attacker).unwrap().next().is_some() {
        g.fail("nothing written through the planted link");
    }
    let copy = ds_copy(&g.stdout()).unwrap_or_else(|| g.fail("a --deepspeed copy"));
    let folder = copy
        .ancestors()
        .find(|a| a.parent() == Some(tmpdir.as_path()))
        .unwrap_or_else(|| g.fail("the copy in a folder under $TMPDIR"));
    if folder.file_name().unwrap().to_string_lossy() == format!("oomguard-{pid}")
        || seen_folder(&g.stdout(), folder) != Some((0o700, false))
    {
        g.fail("a fresh private folder with a random name");
    }
    if folder.exists() {
        g.fail("the fallback folder removed when the run ends");
    }
}

#[test]
fn runs_started_in_the_same_second_in_one_folder_get_their_own_run_folders() {
    let t = tmp();
    let dir = t.path();
    std::fs::write(dir.join("ds.json"), DS_JSON).unwrap();
    let n = 6;
    let mut runs: Vec<Og> = (0..n)
        .map(|i| {
            let code = ds_trainer(&dir.join(format!("flag-{i}")), None);
            Og::start(
                dir,
                &["python3", "-c", &code, "--deepspeed", "ds.json"],
                Opts::default(),
            )
        })
        .collect();
    for g in &mut runs {
        let status = g.wait();
        if status != 0 {
            g.fail("exit 0 after one relaunch");
        }
    }
    let folders: Vec<PathBuf> = std::fs::read_dir(dir.join(".oomguard/runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let starts: Vec<usize> = folders
        .iter()
        .map(|f| events(&journal(f), "run_start").len())
        .collect();
    if folders.len() != n || starts.iter().any(|&s| s != 1) {
        runs[0].fail(&format!(
            "{n} run folders with one run_start each, found {folders:?} with {starts:?}"
        ));
    }
    // Each relaunch trained with its own run's copy.
    for g in &runs {
        let copy = ds_copy(&g.stdout()).unwrap_or_else(|| g.fail("a --deepspeed copy"));
        let owner = folders.iter().find(|f| copy.starts_with(f)).unwrap();
        let argv = events(&journal(owner), "attempt_start")
            .last()
            .map(|e| e["argv"].to_string())
            .unwrap_or_default();
        if !argv.contains(copy.to_str().unwrap()) {
            g.fail("the copy it was given in its own run folder");
        }
    }
}

// ------------------------------------------------------------------ edit in place

/// A project whose module `config/config.py` holds the knobs, and `train.py`, which
/// prints `seq N` and OOMs while MAX_SEQ_LENGTH > 1000; otherwise it prints `ready` and,
/// with `stay`, waits for the file `stop`.
fn module_project(dir: &Path) {
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(dir.join("config/__init__.py"), "").unwrap();
    std::fs::write(dir.join("config/config.py"), MODULE).unwrap();
    std::fs::write(
        dir.join("train.py"),
        format!(
            "import os,sys,time\nfrom config import config\nprint('seq', config.MAX_SEQ_LENGTH, flush=True)\nif config.MAX_SEQ_LENGTH > 1000:\n    print({OOM_LINE:?}, file=sys.stderr)\n    sys.exit(1)\nprint('ready', flush=True)\nwhile 'stay' in sys.argv and not os.path.exists('stop'):\n    time.sleep(0.02)\n"
        ),
    )
    .unwrap();
}

const MODULE: &str = "# model settings\nMAX_SEQ_LENGTH = 1536  # tokens\nLR = 3e-4\n";

fn in_place_args(run_dir: &str, stay: bool) -> Vec<&str> {
    let mut v = vec![
        "--run-dir",
        run_dir,
        "--edit-in-place",
        "--knob",
        "seq_len=config/config.py:MAX_SEQ_LENGTH",
        "python3",
        "train.py",
    ];
    if stay {
        v.push("stay");
    }
    v
}

#[test]
fn restore_after_a_hard_kill_from_another_directory_puts_the_module_back() {
    let t = tmp();
    let proj = t.path().join("proj");
    module_project(&proj);
    let xdg = t.path().join("xdg");
    let xdg_s = xdg.to_str().unwrap().to_owned();
    let envs = [("XDG_RUNTIME_DIR", xdg_s.as_str())];
    let mut g = Og::start(
        &proj,
        &in_place_args("run", true),
        Opts {
            envs: &envs,
            ..Opts::default()
        },
    );
    g.wait_stdout("ready");
    // A hard kill while the module is edited.
    let _ = g.child.kill();
    g.wait();
    if read(&proj.join("config/config.py")) == MODULE {
        g.fail("the module edited while attempt 2 ran");
    }
    let run_abs = proj.join("run");
    let mut r = Og::start(
        t.path(),
        &["restore", run_abs.to_str().unwrap()],
        Opts {
            envs: &envs,
            ..Opts::default()
        },
    );
    r.expect(0, &[]);
    if !r.stdout().contains("restored") || read(&proj.join("config/config.py")) != MODULE {
        r.fail("the module restored byte for byte from another directory");
    }
    if run_abs.join("restore.json").exists() {
        r.fail("restore.json removed once everything is restored");
    }
}

#[test]
fn a_second_run_editing_the_same_module_is_refused_naming_the_first() {
    let t = tmp();
    let proj = t.path();
    module_project(proj);
    let xdg = t.path().join("xdg");
    let xdg_s = xdg.to_str().unwrap().to_owned();
    let envs = [("XDG_RUNTIME_DIR", xdg_s.as_str())];
    let opts = || Opts {
        envs: &envs,
        ..Opts::default()
    };
    let mut first = Og::start(proj, &in_place_args("run-a", true), opts());
    first.wait_stdout("ready");
    let mut second = Og::start(proj, &in_place_args("run-b", false), opts());
    second.expect(
        2,
        &[
            "config.py is being edited in place by another oomguard run",
            &format!("pid {}", first.child.id()),
            "run-a",
        ],
    );
    if second.stdout().contains("seq") {
        second.fail("the second run's command never started");
    }
    std::fs::write(proj.join("stop"), "").unwrap();
    first.expect(0, &["restored"]);
    if read(&proj.join("config/config.py")) != MODULE || proj.join("run-a/restore.json").exists() {
        first.fail("the module back to the original, and its record gone");
    }
}

#[test]
fn a_read_only_module_for_edit_in_place_is_refused_before_anything_runs() {
    let t = tmp();
    let proj = t.path();
    module_project(proj);
    chmod(&proj.join("config/config.py"), 0o444);
    let xdg_s = proj.join("xdg").to_str().unwrap().to_owned();
    let mut g = Og::start(
        proj,
        &in_place_args("run", false),
        Opts {
            envs: &[("XDG_RUNTIME_DIR", &xdg_s)],
            ..Opts::default()
        },
    );
    g.expect(2, &["config/config.py", "read-only"]);
    if g.stdout().contains("seq") {
        g.fail("the command never started");
    }
    if read(&proj.join("config/config.py")) != MODULE {
        g.fail("the module untouched");
    }
}

#[test]
fn a_full_disk_during_an_in_place_edit_leaves_the_module_whole_and_restored() {
    let t = tmp();
    let proj = t.path();
    // Micro-batch 16 halves to 8, 4 and 2 while accumulation doubles from 7 to 14, 28, 56:
    // the same length. Then 1 and 112, one byte longer than the original: the file size
    // limit (the original's size) fails that write of the fifth attempt's edit, as a full
    // disk would. The padding keeps the journal under the limit.
    let mut module = String::from("MICRO_BATCH = 16\nGRAD_ACCUM = 7\n");
    module.push_str(&format!("# {}\n", "x".repeat(64 << 10)));
    std::fs::create_dir_all(proj.join("config")).unwrap();
    std::fs::write(proj.join("config/__init__.py"), "").unwrap();
    std::fs::write(proj.join("config/config.py"), &module).unwrap();
    std::fs::write(
        proj.join("train.py"),
        format!(
            "import sys\nfrom config import config\nprint('micro', config.MICRO_BATCH, flush=True)\nprint({OOM_LINE:?}, file=sys.stderr)\nsys.exit(1)\n"
        ),
    )
    .unwrap();
    let xdg_s = proj.join("xdg").to_str().unwrap().to_owned();
    let mut g = Og::start(
        proj,
        &[
            "--run-dir",
            "run",
            "--edit-in-place",
            "--knob",
            "micro_batch=config/config.py:MICRO_BATCH",
            "--knob",
            "grad_accum=config/config.py:GRAD_ACCUM",
            "python3",
            "train.py",
        ],
        Opts {
            envs: &[("XDG_RUNTIME_DIR", &xdg_s)],
            file_size_limit: Some(module.len() as u64),
        },
    );
    g.wait();
    let micro: Vec<String> = g.stdout().lines().map(String::from).collect();
    if micro != ["micro 16", "micro 8", "micro 4", "micro 2"] {
        g.fail("four attempts ran, down to micro-batch 2");
    }
    if read(&proj.join("config/config.py")) != module {
        g.fail("the module restored whole");
    }
    let left: Vec<_> = std::fs::read_dir(proj.join("config"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    if left.len() != 2 {
        g.fail(&format!("no temporary file left beside it, found {left:?}"));
    }
    if proj.join("run/restore.json").exists() {
        g.fail("restore.json removed: everything was restored");
    }
    g.expect(
        74,
        &["config.py", "File too large", "attempt 5 was not launched"],
    );
}

#[test]
fn restore_puts_back_only_what_its_own_run_wrote() {
    let t = tmp();
    let dir = t.path();
    let victim = dir.join("victim.conf");
    std::fs::write(&victim, "root's own\n").unwrap();
    // A run folder holding a record that "restores" someone else's text over the victim:
    // an entry whose written path is the original itself (what the victim holds).
    let run = dir.join("run");
    std::fs::create_dir_all(run.join("originals")).unwrap();
    chmod(&run, 0o700);
    std::fs::write(run.join("originals/0-victim.conf"), "attacker's\n").unwrap();
    let record = serde_json::json!([{
        "original": victim,
        "backup": run.join("originals/0-victim.conf"),
        "written": victim,
    }]);
    std::fs::write(run.join("restore.json"), record.to_string()).unwrap();
    let mut g = Og::start(dir, &["restore", "run"], Opts::default());
    g.wait();
    if read(&victim) != "root's own\n" {
        g.fail("the victim untouched");
    }
    g.expect(2, &["not a restore record"]);
    // Hashes that match do not make a folder others can write trusted.
    let sha = |b: &[u8]| {
        use std::fmt::Write;
        let mut s = String::new();
        let d = <sha2::Sha256 as sha2::Digest>::digest(b);
        for x in d {
            write!(s, "{x:02x}").unwrap();
        }
        s
    };
    let record = serde_json::json!({
        "oomguard_restore": 2,
        "files": [{
            "original": victim,
            "backup": run.join("originals/0-victim.conf"),
            "original_sha256": sha(b"attacker's\n"),
            "written_sha256": [sha(b"root's own\n")],
        }],
    });
    std::fs::write(run.join("restore.json"), record.to_string()).unwrap();
    chmod(&run, 0o777);
    let mut g = Og::start(dir, &["restore", "run"], Opts::default());
    g.expect(2, &["writable by others"]);
    if read(&victim) != "root's own\n" {
        g.fail("the victim untouched");
    }
}

// ----------------------------------------------------------------- the user's edits

#[test]
fn a_users_edit_of_a_config_during_the_run_is_reported_before_the_relaunch() {
    let t = tmp();
    let dir = t.path();
    std::fs::write(dir.join("ds.json"), DS_JSON).unwrap();
    let flag = dir.join("flag");
    // The user edits ds.json while the first attempt runs (here: the attempt itself).
    let code = format!(
        "import os,sys\nf={flag:?}\nif not os.path.exists(f):\n    open(f,'w').close()\n    t=open('ds.json').read().replace(': 8', ': 2'); open('ds.json','w').write(t)\n    sys.stderr.write('{OOM_LINE}\\n'); sys.exit(1)\nprint('finished', flush=True)\n"
    );
    let mut g = Og::start(
        dir,
        &[
            "--run-dir",
            "run",
            "python3",
            "-c",
            &code,
            "--deepspeed",
            "ds.json",
        ],
        Opts::default(),
    );
    g.expect(
        0,
        &[
            "ds.json was changed since the run started (changed from the start's text: micro_batch 8 → 2); attempt 2 uses the settings read at start",
        ],
    );
    let lines = g
        .stderr()
        .lines()
        .filter(|l| l.contains("was changed since the run started"))
        .count();
    if lines != 1 {
        g.fail("one line about the change");
    }
    let j = journal(&dir.join("run"));
    let changed = events(&j, "config_changed");
    if changed.len() != 1
        || changed[0]["attempt"] != 2
        || changed[0]["knobs"][0]["knob"] != "micro_batch"
        || changed[0]["knobs"][0]["start"] != 8
        || changed[0]["knobs"][0]["now"] != 2
    {
        g.fail(&format!(
            "a config_changed event in the journal, found {changed:?}"
        ));
    }
}
