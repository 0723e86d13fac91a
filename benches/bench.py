#!/usr/bin/env python3
"""oomguard benchmarks, side by side with their baselines (run through benches/run.sh).

Rows:
  pipe wall / pipe cpu   a child writing SIZE bytes of log lines (`yes LINE | head -c SIZE`)
                         under oomguard (stdout to /dev/null) vs `child | cat > /dev/null`.
                         CPU is oomguard's own user+sys (from /proc/PID/stat of the exited,
                         not yet reaped process: its children are not counted) vs cat's.
  direct wall            the same child straight to /dev/null (for scale; no target).
  pty wall / pty cpu     `script -q -c 'oomguard ... child' /dev/null` vs
                         `script -q -c 'child' /dev/null` (both children get a terminal);
                         CPU is the whole tree's (wait4 rusage of script).
  peak RSS               oomguard's VmHWM during the pipe run (polled from /proc/PID/status).
  hang reaction          OOM line printed, child then silent; --hang-timeout 0.001: time from
                         the OOM line to oomguard's exit (it exits only once the group is gone)
                         minus the timeout. Median.
  relaunch gap           attempt 1 prints an OOM and exits; time from its last timestamp to
                         attempt 2's first (`date +%s.%N` in sh), vs the same two runs of sh
                         back to back from a shell. Median.
  signal forward         SIGUSR1 to oomguard -> time the child's sigwait returns, vs SIGUSR1
                         sent to the same child directly. Median.
  diagnose               `oomguard diagnose --json` over the real logs in
                         tests/fixtures/corpus/logs, repeated to SIZE (and over a log of plain
                         progress lines, no failure), in MB/s; baseline `cat FILE > /dev/null`.

Asserts nothing; prints a table. Timings on a shared machine are noisy: medians of repeats.
"""
import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

LINE = "{step 1234/100000 loss 2.3456 lr 2.0e-05 grad_norm 0.87 tokens/s 51234 mem 61.2GiB}"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. "
    "GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is free."
)
TICK = os.sysconf("SC_CLK_TCK")
ROWS = []


def producer(size):
    return ["sh", "-c", f"yes '{LINE}' | head -c {size}"]


def self_cpu_then_reap(p):
    """User+sys seconds of process p alone (not its children), then reap it."""
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    with open(f"/proc/{p.pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    cpu = (int(rest[11]) + int(rest[12])) / TICK
    p.wait()
    return cpu


class HwmPoller(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.kib, self.stop = pid, 0, False

    def run(self):
        while not self.stop:
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.kib = max(self.kib, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.02)


def og_args(binary, run_dir, extra=()):
    return [binary, "-q", "--no-env", "--run-dir", run_dir, *extra]


def pipe_once(binary, size, tmp, n):
    dn = subprocess.DEVNULL
    t = time.perf_counter()
    subprocess.run(producer(size), stdout=dn, check=True)
    direct = time.perf_counter() - t

    t = time.perf_counter()
    p1 = subprocess.Popen(producer(size), stdout=subprocess.PIPE)
    p2 = subprocess.Popen(["cat"], stdin=p1.stdout, stdout=dn)
    p1.stdout.close()
    cat_cpu = self_cpu_then_reap(p2)
    p1.wait()
    cat_wall = time.perf_counter() - t

    t = time.perf_counter()
    og = subprocess.Popen(og_args(binary, f"{tmp}/pipe-{n}") + producer(size), stdout=dn,
                          stderr=dn)
    hwm = HwmPoller(og.pid)
    hwm.start()
    og_cpu = self_cpu_then_reap(og)
    og_wall = time.perf_counter() - t
    hwm.stop = True
    hwm.join()
    if og.returncode != 0:
        sys.exit(f"oomguard pass-through run failed with {og.returncode}")
    return direct, cat_wall, cat_cpu, og_wall, og_cpu, hwm.kib


def tree_cpu(p):
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def pty_once(binary, size, tmp, n):
    inner = shlex.join(producer(size))
    dn = subprocess.DEVNULL
    res = []
    for cmd in (inner, shlex.join(og_args(binary, f"{tmp}/pty-{n}")) + " " + inner):
        t = time.perf_counter()
        p = subprocess.Popen(["script", "-q", "-c", cmd, "/dev/null"], stdin=dn, stdout=dn,
                             stderr=dn)
        cpu = tree_cpu(p)
        res += [time.perf_counter() - t, cpu]
    return res  # base wall, base cpu, og wall, og cpu


HANG_CHILD = f"""
import sys, time
print("ready", flush=True)
t = time.time()
with open(sys.argv[1], "w") as f:
    f.write(repr(t))
sys.stderr.write({OOM!r} + "\\n"); sys.stderr.flush()
while True:
    time.sleep(3600)
"""


def hang_reaction(binary, tmp, trials):
    child = f"{tmp}/hang_child.py"
    with open(child, "w") as f:
        f.write(HANG_CHILD)
    out = []
    for i in range(trials):
        ts = f"{tmp}/hang-ts-{i}"
        args = og_args(binary, f"{tmp}/hang-{i}", ["--hang-timeout", "0.001", "--max-attempts", "1"])
        # No timeout= here: Popen.wait(timeout) polls with sleeps of up to 50 ms, which
        # would be measured as reaction time.
        p = subprocess.run(args + ["python3", child, ts], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        end = time.time()
        if p.returncode != 75:
            sys.exit(f"hang trial: oomguard exited {p.returncode}, expected 75")
        with open(ts) as f:
            out.append(end - float(f.read()) - 0.001)
    return statistics.median(out)


RELAUNCH_SCRIPT = (
    'date +%s.%N >> "$TS"; if [ -e "$FLAG" ]; then exit 0; fi; : > "$FLAG"; '
    f'echo "{OOM}" >&2; date +%s.%N >> "$TS"; exit 1'
)


def gap(ts):
    with open(ts) as f:
        t = [float(x) for x in f.read().split()]
    return t[2] - t[1]


def relaunch_gap(binary, tmp, trials):
    og, base = [], []
    for i in range(trials):
        for kind in ("og", "base"):
            env = dict(os.environ, TS=f"{tmp}/rl-{kind}-{i}.ts", FLAG=f"{tmp}/rl-{kind}-{i}.flag",
                       S=RELAUNCH_SCRIPT)
            if kind == "og":
                args = og_args(binary, f"{tmp}/rl-{i}") + [
                    "sh", "-c", RELAUNCH_SCRIPT, "sh",
                    "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1"]
            else:
                args = ["sh", "-c", 'sh -c "$S"; sh -c "$S"']
            p = subprocess.run(args, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60)
            if p.returncode != 0:
                sys.exit(f"relaunch trial ({kind}) exited {p.returncode}")
            (og if kind == "og" else base).append(gap(env["TS"]))
    return statistics.median(og), statistics.median(base)


SIG_CHILD = """
import signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
print("ready", flush=True)
while True:
    signal.sigwait([signal.SIGUSR1])
    print(repr(time.time()), flush=True)
"""


def signal_latency(binary, tmp, trials):
    res = {}
    for kind in ("og", "base"):
        argv = ["python3", "-c", SIG_CHILD]
        if kind == "og":
            argv = og_args(binary, f"{tmp}/sig") + argv
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert p.stdout.readline().strip() == b"ready"
        lat = []
        for _ in range(trials):
            t0 = time.time()
            os.kill(p.pid, signal.SIGUSR1)
            lat.append(float(p.stdout.readline()) - t0)
            time.sleep(0.02)  # pacing only; nothing is asserted on it
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
        res[kind] = statistics.median(lat)
    return res["og"], res["base"]


def make_log(path, size, lines_only):
    if lines_only:
        unit = ((LINE + "\n") * 4096).encode()
    else:
        d = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "corpus", "logs")
        unit = b"".join(open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)))
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(unit)
            written += len(unit)
    return written


def diagnose_rate(binary, tmp, size, lines_only, reps):
    path = f"{tmp}/big-{int(lines_only)}.log"
    n = make_log(path, size, lines_only)
    og, base = [], []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
        base.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run([binary, "diagnose", "--json", path], stdout=subprocess.DEVNULL, check=True)
        og.append(time.perf_counter() - t)
    os.unlink(path)
    return n / 1e6 / statistics.median(og), n / 1e6 / statistics.median(base)


def row(metric, og, base, unit, target, ok, lower_ratio_better=True):
    ratio = (og / base) if base else None
    ROWS.append((metric, og, base, ratio, unit, target, ok))


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v * 1000:.1f} ms"
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "MiB":
        return f"{v:.1f} MiB"
    if unit == "MB/s":
        return f"{v:.0f} MB/s"
    return f"{v}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--quick", action="store_true", help="small sizes and fewer trials")
    a = ap.parse_args()
    pipe_size = (256 if a.quick else 2048) << 20
    pty_size = (64 if a.quick else 256) << 20
    log_size = (128 if a.quick else 1024) << 20
    trials = 10 if a.quick else 20
    reps = 3

    with tempfile.TemporaryDirectory(prefix="oomguard-bench-") as tmp:
        runs = [pipe_once(a.bin, pipe_size, tmp, i) for i in range(reps)]
        med = [statistics.median(r[i] for r in runs) for i in range(5)]
        direct, cat_wall, cat_cpu, og_wall, og_cpu = med
        hwm = max(r[5] for r in runs) / 1024
        mib = pipe_size >> 20
        row(f"pipe wall ({mib} MiB)", og_wall, cat_wall, "s", "ratio <= 1.15", og_wall <= 1.15 * cat_wall)
        row(f"pipe cpu, own ({mib} MiB)", og_cpu, cat_cpu, "s", "ratio <= 1.5", og_cpu <= 1.5 * cat_cpu)
        row(f"direct to /dev/null ({mib} MiB)", direct, None, "s", "-", None)
        row("peak RSS (VmHWM)", hwm, None, "MiB", "< 16 MiB", hwm < 16)

        runs = [pty_once(a.bin, pty_size, tmp, i) for i in range(reps)]
        b_wall, b_cpu, o_wall, o_cpu = [statistics.median(r[i] for r in runs) for i in range(4)]
        mib = pty_size >> 20
        row(f"pty wall ({mib} MiB, in script)", o_wall, b_wall, "s", "ratio (no target)", None)
        row(f"pty cpu, whole tree ({mib} MiB)", o_cpu, b_cpu, "s", "ratio (no target)", None)

        h = hang_reaction(a.bin, tmp, trials)
        row(f"hang reaction beyond timeout (median of {trials})", h, None, "ms", "< 50 ms", h < 0.05)
        g, gb = relaunch_gap(a.bin, tmp, trials)
        row(f"exit -> next attempt exec (median of {trials})", g, gb, "ms", "< 50 ms", g < 0.05)
        s, sb = signal_latency(a.bin, tmp, trials)
        row(f"signal forward SIGUSR1 (median of {trials})", s, sb, "ms", "< 10 ms", s < 0.01)

        mib = log_size >> 20
        r, rb = diagnose_rate(a.bin, tmp, log_size, False, reps)
        row(f"diagnose, fixture logs x{mib} MiB", r, rb, "MB/s", "> 500 MB/s", r > 500)
        r, rb = diagnose_rate(a.bin, tmp, log_size, True, reps)
        row(f"diagnose, progress lines {mib} MiB", r, rb, "MB/s", "(no target)", None)

    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    head = ("metric", "oomguard", "baseline", "ratio", "target", "result")
    table = [head] + [
        (m, fmt(o, u), fmt(b, u), f"{r:.2f}x" if r else "-", t,
         "-" if ok is None else ("pass" if ok else "FAIL"))
        for m, o, b, r, u, t, ok in ROWS
    ]
    w = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w[j]) for j, c in enumerate(r)).rstrip())
        if i == 0:
            print("  ".join("-" * x for x in w))
    print(f"\nmachine: nproc={os.cpu_count()} cpu=\"{cpu}\" "
          f"mode={'quick' if a.quick else 'full'} date={time.strftime('%Y-%m-%d')}")
    print("baselines: pipe = child | cat > /dev/null; pty = script without oomguard; "
          "relaunch = sh running the child twice; signal = SIGUSR1 to the child directly; "
          "diagnose = cat FILE > /dev/null")


if __name__ == "__main__":
    main()
