//! Unit tests of the GPU functions, on the fake probe (timelines in tests/fixtures/gpu/).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use super::fake::FakeProbe;
use super::*;
use crate::detect::ProcessUse;

const GIB: u64 = 1 << 30;

fn fixture(name: &str) -> FakeProbe {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpu")
        .join(name);
    FakeProbe::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn gpu(index: u32, total_gib: u64, free_gib: u64, processes: Vec<GpuProcess>) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}{index}{index}{index}-0000"),
        name: "Fake".into(),
        total: total_gib * GIB,
        used: (total_gib - free_gib) * GIB,
        free: free_gib * GIB,
        util_percent: None,
        processes,
    }
}

fn proc_(pid: u32, gib: u64, user: &str, attempt: Option<&str>) -> GpuProcess {
    GpuProcess {
        pid,
        used: gib * GIB,
        user: Some(user.into()),
        oomguard_attempt: attempt.map(Into::into),
    }
}

// ---- belongs, visible, pick ----

#[test]
fn belongs_exact_or_run_prefix() {
    assert!(belongs(Some("run"), "run"));
    assert!(!belongs(Some("run2"), "run"));
    assert!(!belongs(None, "run"));
    assert!(!belongs(Some(""), ""));
    let me = run_marker();
    assert!(belongs(Some(&format!("{me}3.1732000000")), &me));
    // Another oomguard whose pid starts with ours is not us: the '.' ends the pid.
    assert!(!belongs(Some(&format!("{}1.0.5", std::process::id())), &me));
}

fn four() -> Vec<GpuState> {
    vec![
        GpuState {
            uuid: "GPU-aaaa1111-0000".into(),
            ..gpu(0, 80, 10, vec![])
        },
        GpuState {
            uuid: "GPU-bbbb2222-0000".into(),
            ..gpu(1, 80, 70, vec![])
        },
        GpuState {
            uuid: "GPU-bbbb3333-0000".into(),
            ..gpu(2, 80, 79, vec![])
        },
        GpuState {
            uuid: "GPU-cccc4444-0000".into(),
            ..gpu(3, 80, 70, vec![])
        },
    ]
}

#[test]
fn visible_honours_cuda_visible_devices() {
    let all = four();
    assert_eq!(visible(&all, None), vec![0, 1, 2, 3], "unset: every GPU");
    assert_eq!(visible(&all, Some("")), Vec::<u32>::new(), "empty: none");
    assert_eq!(visible(&all, Some("2,0")), vec![2, 0], "CUDA order kept");
    assert_eq!(visible(&all, Some(" 3 , 1 ")), vec![3, 1], "spaces");
    assert_eq!(
        visible(&all, Some("GPU-cccc4444-0000")),
        vec![3],
        "full UUID"
    );
    assert_eq!(
        visible(&all, Some("gpu-CCCC,GPU-aaaa")),
        vec![3, 0],
        "UUID prefixes, any case"
    );
    assert_eq!(
        visible(&all, Some("1,7,2")),
        vec![1],
        "an unknown index ends the list"
    );
    assert_eq!(
        visible(&all, Some("1,1,2")),
        vec![1],
        "a duplicate ends the list"
    );
    assert_eq!(
        visible(&all, Some("GPU-bbbb,0")),
        Vec::<u32>::new(),
        "ambiguous prefix"
    );
    assert_eq!(visible(&all, Some("-1")), Vec::<u32>::new(), "-1 hides all");
    assert_eq!(
        visible(&all, Some("MIG-1234,0")),
        Vec::<u32>::new(),
        "MIG is not mapped"
    );
}

#[test]
fn pick_most_free_in_index_order() {
    let all = four();
    assert_eq!(pick(&all, 1), vec![2]);
    // 1 and 3 tie at 70 GiB free: the lower index wins.
    assert_eq!(pick(&all, 2), vec![1, 2]);
    assert_eq!(pick(&all, 3), vec![1, 2, 3]);
    assert_eq!(
        pick(&all, 9),
        vec![0, 1, 2, 3],
        "fewer than asked: all of them"
    );
    assert_eq!(pick(&all, 0), Vec::<u32>::new());
    assert_eq!(cuda_visible_value(&pick(&all, 2)), "1,2");
}

// ---- the fake ----

#[test]
fn fake_json_and_toml_agree_and_fill_defaults() {
    let a = fixture("two_gpus.json").gpus().unwrap();
    let b = fixture("two_gpus.toml").gpus().unwrap();
    assert_eq!(a, b);
    assert_eq!(a.len(), 2);
    assert_eq!(
        a[0].used,
        72 * GIB,
        "used defaults to the sum of the processes"
    );
    assert_eq!(a[0].free, 8 * GIB);
    assert_eq!(a[1].used, GIB / 2, "used_gib given");
    assert_eq!(a[0].processes[1].oomguard_attempt, None);
    let p = FakeProbe::parse(r#"{"snapshots":[{"at_s":0,"gpus":[{"total_gib":8,"processes":[{"pid":1,"used_gib":1,"attempt":"self"}]}]}]}"#, false)
        .unwrap()
        .gpus()
        .unwrap();
    assert_eq!(p[0].index, 0);
    assert_eq!(p[0].uuid, "GPU-fake-0");
    assert_eq!(p[0].processes[0].user, None);
    assert_eq!(
        p[0].processes[0].oomguard_attempt.as_deref(),
        Some(run_marker().as_str())
    );
}

#[test]
fn fake_rejects_bad_timelines_with_one_line() {
    for (text, want) in [
        (r#"{"snapshots":[]}"#, "no snapshots"),
        (
            r#"{"snapshots":[{"at_s":2,"gpus":[]},{"at_s":1,"gpus":[]}]}"#,
            "comes after",
        ),
        (
            r#"{"snapshots":[{"at_s":0,"gpus":[{"total_gib":8,"bogus":1}]}]}"#,
            "bogus",
        ),
        (r#"{"snapshots":[{"at_s":0,"gpus":[{}]}]}"#, "total_gib"),
        ("not json", "bad JSON"),
    ] {
        let e = FakeProbe::parse(text, false).err().expect(text).to_string();
        assert!(e.contains(want), "{text}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
    let e = FakeProbe::open(std::path::Path::new("/nonexistent/t.json"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("cannot read"), "{e}");
}

#[test]
fn fake_error_snapshot_fails_then_recovers() {
    let mut p = fixture("sampler_error.json");
    assert!(p.gpus().is_ok());
    std::thread::sleep(Duration::from_millis(250));
    let e = p.gpus().unwrap_err();
    assert!(e.to_string().contains("GPU is lost"), "{e}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p.gpus().unwrap()[0].processes.len(), 4);
}

// ---- preflight and waits ----

#[test]
fn preflight_lists_foreign_processes_on_the_run_gpus() {
    let mut p = fixture("two_gpus.json");
    let pf = preflight(&mut p, &[1, 0], Some("12345."));
    assert_eq!(
        pf.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        vec![1, 0]
    );
    assert_eq!(pf.foreign.len(), 1, "{pf:?}");
    assert_eq!(pf.foreign[0].pid, 5151);
    assert_eq!(pf.foreign[0].user.as_deref(), Some("bob"));
    assert_eq!(pf.min_free(), Some(8 * GIB));
    assert_eq!(
        pf.summary(),
        "GPU 1: 79.5 of 80.0 GiB free; GPU 0: 8.0 of 80.0 GiB free (pid 5151 bob 1.5 GiB)"
    );
    let v = serde_json::to_value(&pf).unwrap();
    assert_eq!(v["gpus"][1]["free_bytes"], 8 * GIB);
    assert_eq!(v["foreign"][0]["pid"], 5151);
    // No marker: every process is foreign.
    assert_eq!(preflight(&mut p, &[0], None).foreign.len(), 2);
}

#[test]
fn preflight_records_a_probe_error() {
    let mut p = fixture("lost.json");
    let pf = preflight(&mut p, &[0], Some("run"));
    assert!(pf.gpus.is_empty());
    assert!(pf.error.as_deref().unwrap().contains("GPU is lost"));
    assert_eq!(pf.min_free(), None);
    assert!(pf.summary().starts_with("GPU state unknown"));
}

#[test]
fn wait_for_free_returns_when_memory_frees() {
    let mut p = fixture("frees_at_1s.json");
    let mut lines = Vec::new();
    let t = Instant::now();
    let waited = wait_for_free(
        &mut p,
        &[0],
        40 * GIB,
        Duration::from_secs(10),
        Duration::from_millis(400),
        &mut |l| lines.push(l.to_string()),
    )
    .expect("frees at 1 s");
    assert!(waited >= Duration::from_millis(950), "{waited:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // A line at once, then one every 400 ms: 3 by 1 s.
    assert!((2..=4).contains(&lines.len()), "{lines:#?}");
    assert!(
        lines[0].starts_with(
            "waiting for 40.0 GiB free on GPU 0: GPU 0 has 20.0 GiB free (pid 777 bob 60.0 GiB)"
        ),
        "{}",
        lines[0]
    );
}

#[test]
fn wait_for_free_is_immediate_when_enough_is_free() {
    let mut p = fixture("two_gpus.json");
    let mut lines = 0;
    let w = wait_for_free(
        &mut p,
        &[1],
        70 * GIB,
        Duration::from_secs(5),
        Duration::from_secs(1),
        &mut |_| lines += 1,
    );
    assert!(w.unwrap() < Duration::from_millis(100));
    assert_eq!(lines, 0, "nothing printed when there is no wait");
}

#[test]
fn wait_for_free_times_out() {
    let mut p = fixture("two_gpus.json");
    let t = Instant::now();
    let e = wait_for_free(
        &mut p,
        &[0, 1],
        70 * GIB,
        Duration::from_millis(600),
        Duration::from_secs(60),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.waited >= Duration::from_millis(600), "{e:?}");
    assert!(t.elapsed() < Duration::from_millis(1500));
    assert!(
        e.still
            .contains("GPU 0 has 8.0 GiB free (pid 4242 alice 70.5 GiB, pid 5151 bob 1.5 GiB)"),
        "{e}"
    );
    assert!(!e.still.contains("GPU 1"), "GPU 1 has enough: {e}");
    assert!(e.to_string().starts_with("gave up after 0.6s"), "{e}");
    // A GPU that is not there never satisfies the wait.
    let e = wait_for_free(
        &mut p,
        &[5],
        1,
        Duration::from_millis(100),
        Duration::from_secs(1),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.still.contains("GPU 5 not found"), "{e}");
    // A wait that can never succeed fails at once.
    let e = wait_for_free(
        &mut p,
        &[1],
        81 * GIB,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.waited < Duration::from_millis(100), "{e:?}");
    assert_eq!(e.still, "GPU 1 has only 80.0 GiB in all");
    // Nor does a failing probe: it keeps trying until the timeout.
    let mut lost = fixture("lost.json");
    let e = wait_for_free(
        &mut lost,
        &[0],
        1,
        Duration::from_millis(300),
        Duration::from_secs(1),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.still.contains("GPU is lost"), "{e}");
}

#[test]
fn wait_released_waits_for_the_previous_attempt() {
    let timeline = r#"{"snapshots":[
        {"at_s":0,"gpus":[{"total_gib":80,"processes":[
            {"pid":10,"used_gib":30,"attempt":"run","user":"me"},
            {"pid":11,"used_gib":30,"user":"me"},
            {"pid":99,"used_gib":5,"user":"bob"}]}]},
        {"at_s":0.4,"gpus":[{"total_gib":80,"processes":[
            {"pid":11,"used_gib":30,"user":"me"},
            {"pid":99,"used_gib":5,"user":"bob"}]}]},
        {"at_s":0.8,"gpus":[{"total_gib":80,"processes":[
            {"pid":99,"used_gib":5,"user":"bob"}]}]}]}"#;
    // By marker only: released at 0.4 s (pid 11 is not marked, bob is not ours).
    let mut p = FakeProbe::parse(timeline, false).unwrap();
    let w = wait_released(&mut p, &[0], "run", &[], Duration::from_secs(5)).unwrap();
    assert!(
        (Duration::from_millis(350)..Duration::from_millis(1000)).contains(&w),
        "{w:?}"
    );
    // By marker and PID (an unmarked child pid): released at 0.8 s.
    let mut p = FakeProbe::parse(timeline, false).unwrap();
    let w = wait_released(&mut p, &[0], "run", &[11], Duration::from_secs(5)).unwrap();
    assert!(
        (Duration::from_millis(750)..Duration::from_millis(2000)).contains(&w),
        "{w:?}"
    );
    // Other GPUs are not looked at.
    let mut p = FakeProbe::parse(timeline, false).unwrap();
    assert!(
        wait_released(&mut p, &[3], "run", &[11], Duration::from_secs(5)).unwrap()
            < Duration::from_millis(100)
    );
    // Never released: times out saying who.
    let mut p = fixture("two_gpus.json");
    let e = wait_released(&mut p, &[], "12345.", &[], Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.still, "pid 4242 still holds 70.5 GiB on GPU 0");
}

// ---- foreign tenants ----

#[test]
fn tenant_that_grew_after_launch_is_reported() {
    let mut p = fixture("tenant_grows.json");
    let before = preflight(&mut p, &[0], Some("run"));
    assert_eq!(before.foreign.len(), 1, "carol was there before launch");
    std::thread::sleep(Duration::from_millis(350));
    let now = p.gpus().unwrap();
    let t = foreign_tenants(&before.gpus, &now, &[0], "run", None, &[]);
    assert_eq!(
        t,
        vec![Tenant {
            pid: 300,
            user: Some("bob".into()),
            bytes: 35 * GIB,
            grew_by: 35 * GIB,
            gpu: Some(0),
            oomguard_attempt: None,
        }],
        "bob arrived; the run's own growth (pid 100, +10 GiB) and carol (no growth) are not tenants"
    );
    assert_eq!(
        t[0].to_string(),
        "pid 300 (bob) holds 35.0 GiB on GPU 0, +35.0 GiB since launch"
    );
    // The OOM names a GPU outside the tenant's: not the tenant's doing.
    assert!(foreign_tenants(&before.gpus, &now, &[0, 1], "run", Some(1), &[]).is_empty());
    // GPUs not of the run are not looked at.
    assert!(foreign_tenants(&before.gpus, &now, &[1], "run", None, &[]).is_empty());
}

#[test]
fn own_growth_and_steady_neighbours_are_not_tenants() {
    let before = vec![gpu(
        0,
        80,
        40,
        vec![proc_(1, 30, "me", Some("run")), proc_(2, 10, "carol", None)],
    )];
    let now = vec![gpu(
        0,
        80,
        0,
        vec![
            proc_(1, 69, "me", Some("run")),
            proc_(2, 10, "carol", None),
            // A second worker of the run, started after the baseline.
            proc_(3, 1, "me", Some("run")),
        ],
    )];
    assert!(foreign_tenants(&before, &now, &[0], "run", Some(0), &[]).is_empty());
    // Small wobble below MIN_GROWTH is not growth.
    let mut wobble = now.clone();
    wobble[0].processes[1].used += 100 << 20;
    assert!(foreign_tenants(&before, &wobble, &[0], "run", Some(0), &[]).is_empty());
    // A process whose owner is unknown (other PID namespace, gone) is never blamed.
    let mut unknown = now.clone();
    unknown[0].processes.push(GpuProcess {
        pid: 9,
        used: 20 * GIB,
        user: None,
        oomguard_attempt: None,
    });
    assert!(foreign_tenants(&before, &unknown, &[0], "run", Some(0), &[]).is_empty());
    // Another oomguard run is a tenant like any other, and says so.
    let mut other_run = now.clone();
    other_run[0]
        .processes
        .push(proc_(8, 20, "dave", Some("777.0.1")));
    let t = foreign_tenants(&before, &other_run, &[0], "run", Some(0), &[]);
    assert_eq!(t.len(), 1);
    assert!(
        t[0].to_string().contains("[another oomguard run]"),
        "{}",
        t[0]
    );
}

#[test]
fn oom_message_figures_count_too() {
    let before = vec![gpu(
        0,
        80,
        40,
        vec![proc_(1, 30, "me", Some("run")), proc_(2, 10, "carol", None)],
    )];
    // The last sample saw carol steady; the OOM message caught her at 30 GiB.
    let now = before.clone();
    let oom = [
        ProcessUse {
            pid: 2,
            bytes: 30 * GIB,
        },
        ProcessUse {
            pid: 1,
            bytes: 60 * GIB,
        },
    ];
    let t = foreign_tenants(&before, &now, &[0], "run", Some(0), &oom);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(
        (t[0].pid, t[0].bytes, t[0].grew_by),
        (2, 30 * GIB, 20 * GIB)
    );
}

#[test]
fn oom_message_process_missing_from_nvml_is_looked_up_in_proc() {
    // A real process of ours, not of the run: a tenant only the OOM message saw.
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id();
    let oom = [
        ProcessUse {
            pid,
            bytes: 12 * GIB,
        },
        // A PID that does not exist: unknown, never blamed.
        ProcessUse {
            pid: u32::MAX - 7,
            bytes: 12 * GIB,
        },
    ];
    let t = foreign_tenants(&[], &[], &[0], "run", Some(0), &oom);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0].pid, pid);
    assert_eq!(t[0].gpu, Some(0));
    assert!(t[0].user.is_some());
    assert_eq!(t[0].grew_by, 12 * GIB, "no baseline: all it holds");
}

// ---- /proc lookups ----

#[test]
fn procinfo_finds_marker_in_process_or_ancestor() {
    // sh carries the marker; its child `sleep` is started with an empty environment.
    let mut sh = std::process::Command::new("sh")
        .args(["-c", "env -i sleep 30 & echo $!; wait"])
        .env(crate::launch::MARKER_VAR, "test.marker")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let sleep_pid: u32 = line.trim().parse().unwrap();
    let mut cache = procinfo::Cache::default();
    let sh_who = cache.who(sh.id());
    let sleep_who = cache.who(sleep_pid);
    let me = cache.who(std::process::id());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleep_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = sh.wait();
    assert_eq!(sh_who.attempt.as_deref(), Some("test.marker"));
    assert_eq!(
        sleep_who.attempt.as_deref(),
        Some("test.marker"),
        "inherited through the parent"
    );
    assert!(sleep_who.user.is_some());
    assert_eq!(me.user, sh_who.user);
    assert_eq!(
        cache.who(u32::MAX - 7),
        procinfo::Who {
            user: None,
            attempt: None
        }
    );
}

// ---- sampler ----

#[test]
fn sampler_sums_the_run_and_survives_probe_errors() {
    let probe: Box<dyn Probe> = Box::new(fixture("sampler_error.json"));
    let s = PeakSampler::start(probe, vec![0], "run".into(), Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(800));
    let (mut probe, r) = s.stop();
    assert!(r.samples >= 10, "{r:?}");
    assert!(r.errors >= 2 && r.errors < r.samples, "{r:?}");
    // After the error: 30 + 31.5 + 2 GiB of the run's three processes; bob's 5 GiB is not the run's.
    assert_eq!(
        r.per_gpu,
        vec![GpuPeak {
            gpu: 0,
            run_peak_bytes: 63 * GIB + GIB / 2,
            device_peak_bytes: 68 * GIB + GIB / 2,
            total_bytes: 80 * GIB,
        }]
    );
    assert_eq!(r.run_peak(), Some(63 * GIB + GIB / 2));
    assert_eq!(
        r.summary().unwrap(),
        "peak 63.5 of 80.0 GiB on GPU 0: 16.5 GiB headroom"
    );
    assert_eq!(r.last[0].processes.len(), 4, "last good snapshot kept");
    assert!(
        r.cpu_us_per_sample > 0.0 && r.cpu_us_per_sample < 5_000.0,
        "{r:?}"
    );
    let v = serde_json::to_value(&r).unwrap();
    assert!(v.get("last").is_none());
    assert_eq!(v["per_gpu"][0]["run_peak_bytes"], 63 * GIB + GIB / 2);
    // The probe comes back usable.
    assert!(probe.gpus().is_ok());
}

#[test]
fn sampler_stops_promptly_and_reports_least_headroom() {
    let probe: Box<dyn Probe> = Box::new(fixture("two_gpus.json"));
    let s = PeakSampler::start(
        probe,
        vec![0, 1],
        "12345.".into(),
        Duration::from_secs(3600),
    );
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let (_, r) = s.stop();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "stop does not wait a period"
    );
    assert_eq!(r.samples, 1);
    assert_eq!(r.per_gpu.len(), 2);
    assert_eq!(r.per_gpu[1].run_peak_bytes, 0);
    assert_eq!(
        r.summary().unwrap(),
        "peak 70.5 of 80.0 GiB on GPU 0: 9.5 GiB headroom"
    );
    assert_eq!(PeakReport::default().summary(), None);
}

// ---- peaks record ----

#[test]
fn peaks_record_is_private_and_keeps_no_token() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/peaks.json");
    let argv: Vec<OsString> = [
        "torchrun",
        "train.py",
        "--hub_token",
        "hf_abcdefghijklmnopqrstuvwxyz0123",
    ]
    .map(OsString::from)
    .to_vec();
    peaks::record(&path, &argv, 7 * GIB).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("hf_abc"), "a token in peaks.json: {text}");
    assert!(text.contains("torchrun train.py"), "{text}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(peaks::recorded(&path, &argv), Some(7 * GIB));
}

#[test]
fn peaks_record_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/peaks.json");
    let argv: Vec<OsString> = ["torchrun", "train.py", "--bs", "8"]
        .map(OsString::from)
        .to_vec();
    let other: Vec<OsString> = ["torchrun", "train.py", "--bs 8"]
        .map(OsString::from)
        .to_vec();
    assert_ne!(peaks::key(&argv), peaks::key(&other));
    assert_eq!(
        peaks::key(&[]),
        "cbf29ce484222325",
        "FNV-1a offset basis: stable"
    );
    assert_eq!(peaks::recorded(&path, &argv), None);
    peaks::record(&path, &argv, 71 * GIB).unwrap();
    peaks::record(&path, &other, 5 * GIB).unwrap();
    assert_eq!(peaks::recorded(&path, &argv), Some(71 * GIB));
    peaks::record(&path, &argv, 60 * GIB).unwrap();
    assert_eq!(
        peaks::recorded(&path, &argv),
        Some(60 * GIB),
        "the last success wins"
    );
    assert_eq!(peaks::recorded(&path, &other), Some(5 * GIB));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("torchrun train.py --bs 8"), "{text}");
    // A corrupt file is "no record", and is replaced on the next success.
    std::fs::write(&path, "{").unwrap();
    assert_eq!(peaks::recorded(&path, &argv), None);
    peaks::record(&path, &argv, GIB).unwrap();
    assert_eq!(peaks::recorded(&path, &argv), Some(GIB));
}

// ---- `oomguard gpus` rendering ----

#[test]
fn gpus_text_and_json() {
    let all = fixture("two_gpus.json").gpus().unwrap();
    let text = report::render_text(&all, &visible(&all, None), None);
    assert_eq!(
        text,
        "GPU 0  Fake H100 80GB HBM3  GPU-aaaaaaaa-1111-2222-3333-444444444444\n\
         \x20 72.0 of 80.0 GiB used, 8.0 GiB free; utilisation 97%\n\
         \x20 pid 4242  alice  70.5 GiB  oomguard run (attempt 12345.0.1732000000000000000)\n\
         \x20 pid 5151  bob     1.5 GiB\n\
         GPU 1  Fake H100 80GB HBM3  GPU-bbbbbbbb-1111-2222-3333-444444444444\n\
         \x20 0.5 of 80.0 GiB used, 79.5 GiB free; utilisation 0%\n\
         \x20 no process holds memory\n"
    );
    let text = report::render_text(&all, &visible(&all, Some("1")), Some("1"));
    assert!(
        text.starts_with("CUDA_VISIBLE_DEVICES=1: 1 of 2 GPUs visible\nGPU 1 (cuda:0)  Fake"),
        "{text}"
    );
    assert_eq!(
        report::render_text(&all, &[], Some("")),
        "CUDA_VISIBLE_DEVICES=: 0 of 2 GPUs visible\nno GPU visible\n"
    );
    let v: serde_json::Value =
        serde_json::from_str(&report::render_json(&all, &[1], Some("GPU-bbbb"))).unwrap();
    assert_eq!(v["cuda_visible_devices"], "GPU-bbbb");
    assert_eq!(v["gpus"].as_array().unwrap().len(), 1);
    assert_eq!(v["gpus"][0]["index"], 1);
    assert_eq!(v["gpus"][0]["cuda_index"], 0);
}

// ---- NVML on this machine ----

#[test]
fn nvml_without_driver_is_an_error_not_a_panic() {
    match nvml::NvmlProbe::open() {
        Ok(mut p) => {
            // A machine with a driver: the snapshot must work too.
            let all = p.gpus().expect("NVML snapshot");
            assert!(all.iter().all(|g| g.total >= g.used));
        }
        Err(e) => {
            let why = nvml::describe_init_error(&e);
            assert!(!why.contains('\n'), "{why}");
            let line = Unavailable::Nvml(why).to_string();
            assert!(line.starts_with("NVML not available ("), "{line}");
            assert!(line.ends_with("): GPU features off"), "{line}");
        }
    }
}

// ---- cost ----

/// The CPU cost of one sample, measured with the sampler itself: NVML when this machine has
/// it, else the fake plus the `/proc` lookups the NVML probe does for each process.
/// `cargo test --release gpu::tests::measure_sampling_cost -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check: run it by name"]
fn measure_sampling_cost() {
    let every = Duration::from_millis(5);
    let (what, probe): (&str, Box<dyn Probe>) = match nvml::NvmlProbe::open() {
        Ok(p) => ("NVML", Box::new(p)),
        Err(_) => (
            "fake (no NVML here)",
            Box::new(fixture("sampler_error.json")),
        ),
    };
    let s = PeakSampler::start(probe, vec![0], run_marker(), every);
    std::thread::sleep(Duration::from_secs(2));
    let (_, r) = s.stop();
    println!(
        "{what}: {} samples, {:.1} µs CPU per sample",
        r.samples, r.cpu_us_per_sample
    );
    // The /proc part: 64 live processes of ours, looked up as the NVML probe does.
    let mut kids: Vec<std::process::Child> = (0..64)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = kids.iter().map(|k| k.id()).collect();
    let mut cache = procinfo::Cache::default();
    let cpu = |f: &mut dyn FnMut()| {
        let t0 = sample::thread_cpu_time();
        f();
        sample::thread_cpu_time() - t0
    };
    let first = cpu(&mut || {
        for &p in &pids {
            cache.who(p);
        }
    });
    let rounds = 50;
    let cached = cpu(&mut || {
        for _ in 0..rounds {
            for &p in &pids {
                cache.who(p);
            }
        }
    });
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    println!(
        "/proc lookups: first sight {:.1} µs per process, cached {:.1} µs per process",
        first.as_secs_f64() * 1e6 / pids.len() as f64,
        cached.as_secs_f64() * 1e6 / (rounds * pids.len()) as f64
    );
}
