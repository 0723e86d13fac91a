//! One decision per job: the copies of oomguard that supervise one distributed
//! run (one per Slurm task, `srun -n2 oomguard ...`, or one per node,
//! `oomguard torchrun --nnodes 2 --node_rank R ...`) act as one.
//!
//! # Theory of operation
//!
//! The copy of rank 0 (`SLURM_PROCID` 0, torchrun's `--node_rank 0`) is the
//! leader; the others follow. They talk through files in a folder next to the
//! checkpoints, `<checkpoint root>/.oomguard-job/<job key>/`, on the shared
//! filesystem a multi-node resume needs anyway (nothing else: no port, no
//! host). Files are written to a private temporary name and renamed into place,
//! so a reader sees a whole file or none.
//!
//! * `ready-N-R`: copy R is about to launch attempt N. Every copy waits until
//!   all have written theirs (the meeting), so the copies launch together.
//! * `end-N-R.json`: how attempt N ended for copy R (its outcome and the OOM
//!   line it saw, if any), written when it failed; the leader reads the
//!   followers'.
//! * `decision-N.json`: what the leader decided after attempt N: relaunch with
//!   these knob values and this checkpoint, or stop with this status.
//!
//! After a failed attempt a follower never decides and never stops on its own:
//! a peer's OOM shows on the others as `Connection closed by peer`, a
//! `DistStoreError`, a closed rendezvous or an NCCL error, so it writes its end
//! and waits for the decision, bounded by [`Job::timeout`]. The leader, when
//! its own attempt did not end in an OOM, reads the followers' ends: the first
//! OOM among them decides, as if it had been its own.
//!
//! While an attempt runs, each copy also watches the folder
//! ([`Job::moved_on`], asked by the launch loop every half second): a copy
//! another copy of which has written an end for this attempt, and a follower
//! whose leader has published the attempt's decision, stop their own processes
//! at once (SIGTERM, SIGKILL after the grace period) instead of waiting for
//! NCCL's or the rendezvous' timeout — a rank whose peer died, or hung after
//! its OOM, may wait in a collective for many minutes without a word — and
//! then go on as after any failure. A file counts only when it is not older
//! than this copy's own `ready-N-R` (the same filesystem's clock), so one left
//! by an earlier job with the same key never ends an attempt.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::command::{Command, LauncherKind};
use crate::evidence::OutcomeKind;
use crate::settings::Value;

/// How long a copy waits for the others by default (`OOMGUARD_JOB_TIMEOUT`
/// seconds overrides it).
const TIMEOUT: Duration = Duration::from_secs(900);

/// The folder under the checkpoint root.
pub const FOLDER: &str = ".oomguard-job";

/// The job's name, when the pods' manifest exposes it (the Kubeflow operator's
/// `training.kubeflow.org/job-name` label, through the downward API): the job
/// key of a job whose torchrun has no rendezvous id, and of one program per pod.
pub const JOB_NAME: &str = "OOMGUARD_JOB_NAME";

/// This copy's place in the job.
#[derive(Debug, Clone)]
pub struct Job {
    pub rank: u32,
    pub copies: u32,
    /// Where the copies' files are.
    pub dir: PathBuf,
    /// Where rank and copies were read (`SLURM_PROCID=1 of SLURM_NTASKS=2`).
    pub source: String,
    pub timeout: Duration,
}

/// How one follower's attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    pub rank: u32,
    pub outcome: OutcomeKind,
    /// The OOM line that decided, for an OOM.
    pub oom_line: Option<String>,
}

/// What the leader decided after an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Published {
    Relaunch {
        /// Knob name → value for the next attempt.
        knobs: BTreeMap<String, Value>,
        /// The checkpoint every copy resumes from.
        resume: Option<PathBuf>,
    },
    Stop {
        code: i32,
    },
}

/// What a copy is about to launch, in its `ready-N-R` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub copies: u32,
    pub world: u64,
    /// The settings, as the journal says them (`micro_batch=8 grad_accum=4 ...`).
    pub settings: String,
    /// Set when this copy found the job's copies disagreeing, and stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disagree: Option<String>,
}

impl Ready {
    /// How copy `them`'s launch differs from copy `me`'s, if it does.
    fn differs(&self, other: &Ready, me: u32, them: u32) -> Option<String> {
        if self.copies != other.copies {
            return Some(format!(
                "copy {me} counts {} copies, copy {them} counts {}",
                self.copies, other.copies
            ));
        }
        if self.world != other.world {
            return Some(format!(
                "copy {me} has world size {}, copy {them} has {}",
                self.world, other.world
            ));
        }
        (self.settings != other.settings).then(|| {
            format!(
                "copy {me} would launch with {}, copy {them} with {}",
                self.settings, other.settings
            )
        })
    }
}

/// How a meeting before an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meeting {
    Met,
    /// Not every copy came within the timeout.
    Late,
    /// The copies are not about to launch the same job: why.
    Disagree(String),
}

/// What a copy of a job does after one of its attempts ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAttempt {
    /// As a run of one copy would (a success, the user's interrupt; the leader's
    /// own OOM or absurd request), the leader then publishing what it decided.
    Alone,
    /// A follower's failure, whatever it was: say how it ended, and wait for the
    /// leader's decision. Never stop alone: a peer's OOM shows here as a peer's
    /// failure (`Connection closed by peer`, a rendezvous or NCCL error).
    WaitForDecision,
    /// The leader's failure that is not an OOM of its own (a peer's failure,
    /// another error): read the followers' ends first, whose OOM decides.
    CollectEnds,
}

/// What a copy does after an attempt that ended with `outcome`.
pub fn after_attempt(leader: bool, outcome: OutcomeKind) -> AfterAttempt {
    use OutcomeKind as K;
    match (leader, outcome) {
        (_, K::Success | K::Interrupted) => AfterAttempt::Alone,
        (false, _) => AfterAttempt::WaitForDecision,
        (true, K::OtherFailure | K::HostOom | K::PeerFailure) => AfterAttempt::CollectEnds,
        (true, _) => AfterAttempt::Alone,
    }
}

/// Why copies cannot act as one job (a warning; each then decides alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoChannel(pub String);

fn env_u32(env: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Option<u32> {
    env(name)?.to_str()?.trim().parse().ok()
}

fn env_str(env: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Option<String> {
    env(name)?.into_string().ok().filter(|s| !s.is_empty())
}

/// A name safe as one path component.
fn component(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Job {
    /// This copy's place, when it is one of several: inside a Slurm step of
    /// several tasks (and not wrapping `srun` itself), or a torchrun with
    /// `--nnodes N --node_rank R` (N > 1). `Ok(None)`: a job of one copy.
    /// `root`: the checkpoint folder (the channel lives next to it).
    pub fn detect(
        cmd: &Command,
        env: &dyn Fn(&str) -> Option<OsString>,
        root: Option<&Path>,
    ) -> Result<Option<Job>, NoChannel> {
        let wraps_srun = cmd
            .launchers
            .first()
            .is_some_and(|l| l.kind == LauncherKind::Srun);
        let slurm = match (
            env_u32(env, "SLURM_PROCID"),
            env_u32(env, "SLURM_NTASKS").or_else(|| env_u32(env, "SLURM_STEP_NUM_TASKS")),
            env_str(env, "SLURM_JOB_ID"),
        ) {
            (Some(rank), Some(copies), Some(job)) if copies > 1 && !wraps_srun => {
                let step = env_str(env, "SLURM_STEP_ID").unwrap_or_else(|| "0".into());
                Some((
                    rank,
                    copies,
                    format!("slurm-{job}.{step}"),
                    format!("SLURM_PROCID={rank} of SLURM_NTASKS={copies}"),
                ))
            }
            _ => None,
        };
        // torchrun's place, from its command line or, as torchrun reads them,
        // its `PET_` variables (a Kubernetes operator's configuration).
        let torchrun = || {
            let opt = |names: &[&str]| crate::frameworks::launchers::torchrun_opt(cmd, env, names);
            let nnodes = opt(&["--nnodes"])?;
            let node_rank = opt(&["--node_rank", "--node-rank"])?;
            let nodes: u32 = nnodes.value.parse().ok()?;
            let rank: u32 = node_rank.value.parse().ok()?;
            if nodes < 2 {
                return None;
            }
            let id = opt(&["--rdzv_id", "--rdzv-id"])
                .map(|o| o.value)
                .or_else(|| env_str(env, JOB_NAME))
                .or_else(|| opt(&["--rdzv_endpoint", "--rdzv-endpoint"]).map(|o| o.value))
                .or_else(|| opt(&["--master_port", "--master-port"]).map(|o| o.value))
                .unwrap_or_else(|| "default".into());
            let source = if nnodes.from.starts_with("--") && node_rank.from.starts_with("--") {
                format!("torchrun --node_rank {rank} of --nnodes {nodes}")
            } else {
                format!("torchrun {} of {}", node_rank.from, nnodes.from)
            };
            Some((rank, nodes, format!("torchrun-{id}"), source))
        };
        // One program per pod (`WORLD_SIZE`, `RANK`): the job's name, else where
        // its ranks meet (`MASTER_ADDR:MASTER_PORT`, the operator's stable
        // service name), never the pod's own name, which a restart changes.
        let per_pod = || {
            if cmd.launchers.iter().any(|l| l.kind != LauncherKind::Python) {
                return None;
            }
            let p = crate::frameworks::launchers::per_pod(env)?;
            let id = env_str(env, JOB_NAME)
                .or_else(|| {
                    let addr = env_str(env, "MASTER_ADDR")?;
                    let port = env_str(env, "MASTER_PORT").unwrap_or_default();
                    Some(format!("{addr}-{port}"))
                })
                .unwrap_or_else(|| "default".into());
            Some((p.pod, p.pods, format!("pods-{id}"), p.source))
        };
        let Some((rank, copies, key, source)) = slurm.or_else(torchrun).or_else(per_pod) else {
            return Ok(None);
        };
        let Some(root) = root else {
            return Err(NoChannel(format!(
                "this is copy {rank} of {copies} of a job ({source}), but the command names no checkpoint folder, where the copies would meet: each copy decides alone (name the output folder, e.g. --output_dir)"
            )));
        };
        let timeout = env_str(env, "OOMGUARD_JOB_TIMEOUT")
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(TIMEOUT, Duration::from_secs_f64);
        Ok(Some(Job {
            rank,
            copies,
            dir: root.join(FOLDER).join(component(&key)),
            source,
            timeout,
        }))
    }

    /// Whether each copy runs one rank of the job's world (a Slurm task that
    /// runs no launcher of its own): the job's world is then the copies times
    /// what one copy's command starts.
    pub fn copies_are_ranks(&self, cmd: &Command) -> bool {
        self.source.starts_with("SLURM_PROCID")
            && !cmd.launchers.iter().any(|l| {
                matches!(
                    l.kind,
                    LauncherKind::Torchrun | LauncherKind::Accelerate | LauncherKind::DeepSpeed
                )
            })
    }

    pub fn leader(&self) -> bool {
        self.rank == 0
    }

    fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        write_private(&self.dir, name, bytes)
    }

    fn read<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Option<T> {
        let text = std::fs::read_to_string(self.dir.join(name)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Polls until `f` answers or the timeout passes.
    fn wait<T>(&self, mut f: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(v) = f() {
                return Some(v);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The leader, before the first attempt: files of an earlier job with the
    /// same key are not this job's (the copies' `ready-1` files stay).
    pub fn clear_stale(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let stale = name.starts_with("end-")
                || name.starts_with("decision-")
                || (name.starts_with("ready-") && !name.starts_with("ready-1-"));
            if stale {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// The meeting before attempt `n`, where the copies also check that they
    /// are about to launch the same job: the same number of copies, the same
    /// world size, the same settings (pods of one Kubernetes job whose
    /// manifests or environments differ, a restarted pod that did not find the
    /// job's settings). A copy's `ready-n-R` holds what it is about to launch.
    ///
    /// A `ready` file that disagrees and is older than this copy's own may be
    /// an earlier job's, with the same key, whose copy has not come yet: it is
    /// waited on (its copy rewrites it when it comes) until the timeout. One
    /// written after this copy's is this job's: the disagreement is said at
    /// once, and written into this copy's own file, so the others stop too.
    pub fn meet_as(&self, n: u32, me: &Ready) -> Meeting {
        let name = |r: u32| format!("ready-{n}-{r}");
        let own = name(self.rank);
        let write = |r: &Ready| {
            let json = serde_json::to_vec(r).expect("Ready serialises");
            self.write(&own, &json)
        };
        if let Err(e) = write(me) {
            tracing::warn!("job folder {}: {e}", self.dir.display());
            return Meeting::Late;
        }
        let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut doubt: Option<String> = None;
        let met = self.wait(|| {
            let mine = mtime(&self.dir.join(&own));
            let mut all = true;
            doubt = None;
            for r in (0..self.copies).filter(|r| *r != self.rank) {
                let path = self.dir.join(name(r));
                let Some(theirs) = mtime(&path) else {
                    all = false;
                    continue;
                };
                // An empty file: a copy that says nothing of itself.
                let Some(other) = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Ready>(&b).ok())
                else {
                    continue;
                };
                let ours = mine.is_none_or(|m| theirs >= m);
                if let Some(why) = &other.disagree
                    && ours
                {
                    return Some(Err(format!("copy {r} of the job: {why}")));
                }
                if let Some(why) = me.differs(&other, self.rank, r) {
                    if ours {
                        return Some(Err(why));
                    }
                    doubt = Some(why);
                    all = false;
                }
            }
            all.then_some(Ok(()))
        });
        let why = match met {
            Some(Ok(())) => return Meeting::Met,
            Some(Err(why)) => why,
            None => match doubt {
                Some(why) => why,
                None => return Meeting::Late,
            },
        };
        let said = Ready {
            disagree: Some(why.clone()),
            ..me.clone()
        };
        let _ = write(&said);
        Meeting::Disagree(why)
    }

    /// The meeting before attempt `n` of copies that say nothing of what they
    /// launch: false when not every copy came in time.
    #[cfg(test)]
    pub fn meet(&self, n: u32) -> bool {
        let unsaid = Ready {
            copies: self.copies,
            world: 0,
            settings: String::new(),
            disagree: None,
        };
        self.meet_as(n, &unsaid) == Meeting::Met
    }

    /// This copy's end of attempt `n`.
    pub fn publish_end(&self, n: u32, end: &End) -> std::io::Result<()> {
        let json = serde_json::to_vec(end).expect("End serialises");
        self.write(&format!("end-{n}-{}.json", self.rank), &json)
    }

    /// The leader: the followers' ends of attempt `n`, as many as came within
    /// the timeout (it stops waiting as soon as one reports an OOM).
    pub fn await_ends(&self, n: u32) -> Vec<End> {
        let read = || -> Vec<End> {
            (1..self.copies)
                .filter_map(|r| self.read(&format!("end-{n}-{r}.json")))
                .collect()
        };
        self.wait(|| {
            let ends = read();
            let oom = ends.iter().any(|e| e.oom_line.is_some());
            (oom || ends.len() + 1 >= self.copies as usize).then_some(ends)
        })
        .unwrap_or_else(read)
    }

    /// The leader's decision after attempt `n`.
    pub fn publish_decision(&self, n: u32, d: &Published) -> std::io::Result<()> {
        let json = serde_json::to_vec(d).expect("Published serialises");
        self.write(&format!("decision-{n}.json"), &json)
    }

    /// A follower: the leader's decision after attempt `n`, or None after the timeout.
    pub fn await_decision(&self, n: u32) -> Option<Published> {
        self.wait(|| self.decision(n))
    }

    /// `dir/name` as attempt `n`'s, if it is there and this job's: not older than
    /// this copy's own `ready-n-R` (an earlier job's with the same key is).
    fn fresh<T: for<'de> Deserialize<'de>>(&self, n: u32, name: &str) -> Option<T> {
        let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let ours = mtime(&self.dir.join(format!("ready-{n}-{}", self.rank)));
        let theirs = mtime(&self.dir.join(name))?;
        if ours.is_some_and(|r| theirs < r) {
            return None;
        }
        self.read(name)
    }

    /// The leader's decision after attempt `n`, if it is there and this job's.
    fn decision(&self, n: u32) -> Option<Published> {
        self.fresh(n, &format!("decision-{n}.json"))
    }

    /// While attempt `n` runs: why this copy should end it now, because the job
    /// has moved on without it — another copy's attempt ended in failure (its
    /// ranks are gone, so this copy's wait in a collective that cannot complete),
    /// or, for a follower, the leader's decision is out.
    pub fn moved_on(&self, n: u32) -> Option<String> {
        if !self.leader() {
            // Copy 0's success is no reason to stop: this copy's ranks are
            // finishing too (ending them would turn a success into a failure).
            let decided = self.decision(n).and_then(|d| match d {
                Published::Relaunch { .. } => Some(format!(
                    "copy 0 of the job decided to relaunch after attempt {n}"
                )),
                Published::Stop { code: 0 } => None,
                Published::Stop { code } => Some(format!(
                    "copy 0 of the job stopped after attempt {n} (status {code})"
                )),
            });
            if decided.is_some() {
                return decided;
            }
        }
        // One listing of the folder, then only the files that are there (cheap on
        // a shared filesystem, whatever the number of copies).
        let prefix = format!("end-{n}-");
        let own = format!("end-{n}-{}.json", self.rank);
        let names: Vec<String> = std::fs::read_dir(&self.dir)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(&prefix) && name.ends_with(".json") && *name != own)
            .collect();
        let ends: Vec<End> = names
            .iter()
            .filter_map(|name| self.fresh(n, name))
            .collect();
        let end = ends
            .iter()
            .find(|e| e.oom_line.is_some())
            .or_else(|| ends.first())?;
        Some(format!(
            "copy {} of the job ended attempt {n} ({})",
            end.rank,
            serde_json::to_value(end.outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        ))
    }
}

/// Writes `dir/name` whole: a private temporary file renamed into place.
fn write_private(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))
}

/// `previous-run` in a requeued job's new run folder: the old run folder's path.
pub fn write_previous_run(run_dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(run_dir.join("previous-run"))?;
    f.write_all(bytes)
}

/// The settings a Slurm job last launched with, kept next to its checkpoints
/// so that a requeued or preempted job (`SLURM_RESTART_COUNT` > 0) starts
/// there instead of at the settings that did not fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fitting {
    pub knobs: BTreeMap<String, Value>,
    /// The run folder that launched them.
    pub run_dir: PathBuf,
}

/// Where a Slurm job keeps its [`Fitting`]: `<root>/.oomguard-job/slurm-JOB/fitting.json`.
pub fn fitting_path(env: &dyn Fn(&str) -> Option<OsString>, root: &Path) -> Option<PathBuf> {
    let job = env_str(env, "SLURM_JOB_ID")?;
    Some(
        root.join(FOLDER)
            .join(component(&format!("slurm-{job}")))
            .join("fitting.json"),
    )
}

/// Inside a Kubernetes pod (the kubelet sets `KUBERNETES_SERVICE_HOST` in every
/// container), where the job of an operator (PyTorchJob, JobSet, Volcano)
/// restarts a failed pod's container or the whole job by itself.
pub fn in_pod(env: &dyn Fn(&str) -> Option<OsString>) -> bool {
    env_str(env, "KUBERNETES_SERVICE_HOST").is_some()
}

/// Where a Kubernetes job keeps its [`Fitting`]: in the job's folder (its key is
/// the rendezvous id or the job's name, which a restarted pod keeps, never the
/// pod's name, which changes). A job of one pod has a folder too, when its key
/// is known. None outside a pod or without a key.
pub fn pod_fitting_path(
    cmd: &Command,
    env: &dyn Fn(&str) -> Option<OsString>,
    job: Option<&Job>,
    root: &Path,
) -> Option<PathBuf> {
    if !in_pod(env) || env_str(env, "SLURM_JOB_ID").is_some() {
        return None;
    }
    if let Some(j) = job {
        return Some(j.dir.join("fitting.json"));
    }
    let key =
        match crate::frameworks::launchers::torchrun_opt(cmd, env, &["--rdzv_id", "--rdzv-id"]) {
            Some(o) => format!("torchrun-{}", o.value),
            None if cmd.launcher(LauncherKind::Torchrun).is_some() => {
                format!("torchrun-{}", env_str(env, JOB_NAME)?)
            }
            None => format!("pods-{}", env_str(env, JOB_NAME)?),
        };
    Some(root.join(FOLDER).join(component(&key)).join("fitting.json"))
}

/// A finished job's settings are not a restart's: a job submitted again under
/// the same name starts as its command says.
pub fn forget_fitting(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// How many times Slurm restarted this job (requeue, preemption).
pub fn restart_count(env: &dyn Fn(&str) -> Option<OsString>) -> u32 {
    env_u32(env, "SLURM_RESTART_COUNT").unwrap_or(0)
}

pub fn save_fitting(path: &Path, f: &Fitting) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("fitting.json");
    write_private(
        dir,
        name,
        &serde_json::to_vec(f).expect("Fitting serialises"),
    )
}

pub fn load_fitting(path: &Path) -> Option<Fitting> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(s: &str) -> Command {
        let argv: Vec<OsString> = s.split_whitespace().map(OsString::from).collect();
        Command::parse(&argv)
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    const TASK1: &[(&str, &str)] = &[
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_ID", "42"),
        ("SLURM_STEP_ID", "0"),
    ];

    #[test]
    fn copies_are_found_in_a_slurm_step_and_a_multi_node_torchrun() {
        let root = Path::new("/shared/out");
        let j = Job::detect(&cmd("python3 t.py"), &env(TASK1), Some(root))
            .unwrap()
            .unwrap();
        assert_eq!((j.rank, j.copies, j.leader()), (1, 2, false));
        assert!(j.copies_are_ranks(&cmd("python3 t.py")));
        assert!(!j.copies_are_ranks(&cmd("torchrun --nnodes 2 --nproc_per_node 4 t.py")));
        assert_eq!(j.dir, root.join(".oomguard-job/slurm-42.0"));
        let t = cmd("torchrun --nnodes 2 --node_rank 0 --rdzv_id exp1 --nproc_per_node 4 t.py");
        let j = Job::detect(&t, &env(&[]), Some(root)).unwrap().unwrap();
        assert_eq!((j.rank, j.copies, j.leader()), (0, 2, true));
        assert!(j.dir.ends_with("torchrun-exp1"));
        // oomguard wrapping srun is the job's only copy.
        assert!(
            Job::detect(&cmd("srun -n2 python3 t.py"), &env(TASK1), Some(root))
                .unwrap()
                .is_none()
        );
        // One task, one node: no job.
        assert!(
            Job::detect(&cmd("python3 t.py"), &env(&[]), Some(root))
                .unwrap()
                .is_none()
        );
        assert!(
            Job::detect(
                &cmd("torchrun --nnodes 1 --node_rank 0 t.py"),
                &env(&[]),
                Some(root)
            )
            .unwrap()
            .is_none()
        );
        // Several copies and nowhere to meet: said.
        let e = Job::detect(&cmd("python3 t.py"), &env(TASK1), None).unwrap_err();
        assert!(e.0.contains("SLURM_PROCID=1 of SLURM_NTASKS=2"), "{}", e.0);
    }

    fn job(dir: &Path, rank: u32) -> Job {
        Job {
            rank,
            copies: 2,
            dir: dir.to_path_buf(),
            source: String::new(),
            timeout: Duration::from_secs(20),
        }
    }

    #[test]
    fn a_follower_waits_for_the_leaders_decision_and_both_meet() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let (leader, follower) = (job(&dir, 0), job(&dir, 1));
        let f = std::thread::spawn(move || {
            assert!(follower.meet(1));
            let end = End {
                rank: 1,
                outcome: OutcomeKind::CudaOom,
                oom_line: Some("torch.OutOfMemoryError: CUDA out of memory.".into()),
            };
            follower.publish_end(1, &end).unwrap();
            let d = follower.await_decision(1).expect("a decision");
            assert!(follower.meet(2));
            d
        });
        leader.clear_stale();
        assert!(leader.meet(1));
        let ends = leader.await_ends(1);
        assert_eq!(ends.len(), 1);
        assert_eq!(ends[0].outcome, OutcomeKind::CudaOom);
        let d = Published::Relaunch {
            knobs: BTreeMap::from([("micro_batch".to_string(), Value::Int(4))]),
            resume: Some(PathBuf::from("/shared/out/checkpoint-5")),
        };
        leader.publish_decision(1, &d).unwrap();
        assert!(leader.meet(2));
        assert_eq!(f.join().unwrap(), d);
    }

    #[test]
    fn the_fitting_settings_survive_a_requeue() {
        let t = tempfile::tempdir().unwrap();
        let env = env(&[("SLURM_JOB_ID", "9"), ("SLURM_RESTART_COUNT", "1")]);
        let path = fitting_path(&env, t.path()).unwrap();
        assert!(path.ends_with(".oomguard-job/slurm-9/fitting.json"));
        assert_eq!(restart_count(&env), 1);
        assert_eq!(load_fitting(&path), None);
        let f = Fitting {
            knobs: BTreeMap::from([("micro_batch".to_string(), Value::Int(4))]),
            run_dir: PathBuf::from("/runs/a"),
        };
        save_fitting(&path, &f).unwrap();
        save_fitting(&path, &f).unwrap();
        assert_eq!(load_fitting(&path), Some(f));
    }

    #[test]
    fn a_running_copy_hears_that_the_job_moved_on() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let (leader, follower) = (job(&dir, 0), job(&dir, 1));
        // A decision an earlier job with the same key left: older than this copy's
        // ready file, so it is not this job's.
        let d = Published::Relaunch {
            knobs: BTreeMap::new(),
            resume: None,
        };
        leader.publish_decision(1, &d).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(dir.join("decision-1.json"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| assert!(follower.meet(1)));
            assert!(leader.meet(1));
        });
        assert_eq!(follower.moved_on(1), None, "an earlier job's decision");
        assert_eq!(leader.moved_on(1), None, "no follower has ended");
        // The follower's attempt ends: the leader hears it while its own still runs.
        let end = End {
            rank: 1,
            outcome: OutcomeKind::HungAfterOom,
            oom_line: Some("torch.OutOfMemoryError: CUDA out of memory.".into()),
        };
        follower.publish_end(1, &end).unwrap();
        let why = leader.moved_on(1).expect("the leader hears the end");
        assert!(
            why.contains("copy 1") && why.contains("hung_after_oom"),
            "{why}"
        );
        assert_eq!(follower.moved_on(1), None, "its own end is no news");
        // The leader's own attempt failed: the follower hears that too.
        let own = End {
            rank: 0,
            outcome: OutcomeKind::PeerFailure,
            oom_line: None,
        };
        leader.publish_end(1, &own).unwrap();
        let why = follower
            .moved_on(1)
            .expect("the follower hears copy 0's end");
        assert!(
            why.contains("copy 0 of the job ended attempt 1 (peer_failure)"),
            "{why}"
        );
        // The leader decides: the follower hears it while its own attempt still runs.
        leader.publish_decision(1, &d).unwrap();
        let why = follower
            .moved_on(1)
            .expect("the follower hears the decision");
        assert!(
            why.contains("copy 0 of the job decided to relaunch"),
            "{why}"
        );
        assert_eq!(follower.moved_on(2), None, "not the next attempt's");
        // Copy 0 finished: this copy's ranks finish too, unhurried.
        leader
            .publish_decision(2, &Published::Stop { code: 0 })
            .unwrap();
        assert_eq!(follower.moved_on(2), None);
        leader
            .publish_decision(3, &Published::Stop { code: 1 })
            .unwrap();
        assert!(follower.moved_on(3).unwrap().contains("stopped"));
    }

    #[test]
    fn copies_that_launch_differently_disagree_and_an_earlier_jobs_file_is_waited_on() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let ready = |settings: &str| Ready {
            copies: 2,
            world: 8,
            settings: settings.into(),
            disagree: None,
        };
        // An earlier job's ready file, with other settings: not this job's, so the
        // leader waits for its copy, which comes and agrees.
        let (leader, follower) = (job(&dir, 0), job(&dir, 1));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("ready-1-1"),
            serde_json::to_vec(&ready("micro_batch=16")).unwrap(),
        )
        .unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(dir.join("ready-1-1"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                assert_eq!(follower.meet_as(1, &ready("micro_batch=4")), Meeting::Met);
            });
            assert_eq!(leader.meet_as(1, &ready("micro_batch=4")), Meeting::Met);
        });
        // This job's copies differ: both say so, neither waits for the timeout.
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                let m = follower.meet_as(2, &ready("micro_batch=8"));
                assert!(
                    matches!(&m, Meeting::Disagree(w) if w.contains("micro_batch=4")),
                    "{m:?}"
                );
            });
            let m = leader.meet_as(2, &ready("micro_batch=4"));
            assert!(
                matches!(&m, Meeting::Disagree(w) if w.contains("micro_batch=8")),
                "{m:?}"
            );
        });
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn waits_are_bounded() {
        let t = tempfile::tempdir().unwrap();
        let mut j = job(t.path(), 1);
        j.timeout = Duration::from_millis(200);
        assert_eq!(j.await_decision(3), None);
        assert!(!j.meet(3));
    }
}
