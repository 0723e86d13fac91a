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
//! * `ready-N-R`: copy R is about to launch attempt N, and what it launches
//!   (its count of copies, the world size, its settings). Every copy waits
//!   until all have written theirs (the meeting), so the copies launch
//!   together. At the first, each holds the copy's random nonce.
//! * `meeting-1.json`: copy 0's answer at the first meeting: the job's random
//!   token, the nonces it saw, its settings for attempt 1 (the followers adopt
//!   them: the copies start alike) and, when a copy cannot launch what copy 0
//!   launches (another count of copies or world size, settings it cannot
//!   adopt), why: then no copy launches, and each stops with status 2.
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
//! then go on as after any failure. Every file after the first meeting carries
//! the job's token, and a file counts only with it (no file's date is
//! trusted), so one left by an earlier job with the same key never ends an
//! attempt, makes a meeting or says a disagreement.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::command::{Command, LauncherKind};
use crate::evidence::OutcomeKind;
use crate::run_folder;
use crate::settings::{Knob, Value};

/// How long a copy waits for the others by default (`OOMGUARD_JOB_TIMEOUT`
/// seconds overrides it).
const TIMEOUT: Duration = Duration::from_secs(900);

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
    /// The job's folder, opened once checked ([`Job::open`]).
    handle: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The job's token: made by copy 0 at the first meeting, known to its
    /// copies only (it is in the private folder); a message without it is
    /// not this job's.
    token: std::sync::Arc<std::sync::OnceLock<String>>,
    /// This copy's random nonce for the first meeting.
    nonce: String,
}

/// How one follower's attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    pub rank: u32,
    pub outcome: OutcomeKind,
    /// The OOM line that decided, for an OOM.
    pub oom_line: Option<String>,
}

/// What the leader decided after an attempt: its verdict (`next::Verdict`) as
/// the job's channel carries it to the other copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Published {
    Relaunch {
        /// Every knob of the next attempt (one copy 0 dropped is absent).
        knobs: BTreeMap<Knob, Value>,
        /// The checkpoint every copy resumes from.
        resume: Option<PathBuf>,
    },
    Stop {
        code: i32,
    },
}

impl Published {
    /// Copy 0's verdict, carried out (a relaunch names the checkpoint it
    /// resumes from), for the other copies; `None`: nothing to publish (a
    /// wait, or a follower's).
    pub fn of(v: &crate::next::Verdict) -> Option<Published> {
        use crate::next::{Resume, Verdict};
        match v {
            Verdict::Relaunch {
                settings, resume, ..
            } => Some(Published::Relaunch {
                knobs: settings.knobs.clone(),
                resume: match resume {
                    Resume::From(p) => Some(p.clone()),
                    Resume::Newest | Resume::Same | Resume::Fresh => None,
                },
            }),
            Verdict::Stop { code, .. } => Some(Published::Stop { code: *code }),
            Verdict::Wait(_) | Verdict::Follow => None,
        }
    }
}

/// What a copy is about to launch, said in its `ready-N-R` at each meeting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// How many copies this copy counts in the job.
    pub copies: u32,
    pub world: u64,
    /// Knob name → value: the knobs this copy's command binds.
    pub knobs: BTreeMap<String, Value>,
    /// The global batch of these settings (None: not known).
    pub global_batch: Option<u64>,
    /// The settings, as the journal says them (`micro_batch=8 grad_accum=4 ...`).
    pub settings: String,
}

impl Launch {
    /// What a copy counting `copies` copies launches with `s`.
    pub fn new(copies: u32, s: &crate::settings::Settings) -> Launch {
        Launch {
            copies,
            world: s.world_size,
            knobs: s
                .knobs
                .iter()
                .map(|(k, v)| (k.name().to_string(), v.clone()))
                .collect(),
            global_batch: s.global_batch(),
            settings: s.to_string(),
        }
    }

    /// Why copy `them` cannot launch what copy `me` launches, if it cannot.
    /// The number of copies and the world size cannot be adopted. At the first
    /// meeting (`adopt`) a follower takes copy 0's settings, which it can only
    /// where its command binds the same knobs and has the same global batch
    /// (oomguard never changes a global batch); later, the copies' settings
    /// (each follows copy 0's decision) must be the same.
    fn differs(&self, other: &Launch, me: u32, them: u32, adopt: bool) -> Option<String> {
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
        let batch = |g: Option<u64>| g.map_or("unknown".into(), |g| g.to_string());
        if adopt {
            if !self.knobs.keys().eq(other.knobs.keys()) {
                let names = |l: &Launch| l.knobs.keys().cloned().collect::<Vec<_>>().join(" ");
                return Some(format!(
                    "copy {them} cannot take copy {me}'s settings: copy {me}'s command sets {}, copy {them}'s sets {}",
                    names(self),
                    names(other)
                ));
            }
            return (self.global_batch != other.global_batch).then(|| {
                format!(
                    "copy {me} would launch with {} (global batch {}), copy {them} with {} (global batch {}): copy {them} cannot take copy {me}'s settings without changing its global batch",
                    self.settings,
                    batch(self.global_batch),
                    other.settings,
                    batch(other.global_batch)
                )
            });
        }
        (self.settings != other.settings).then(|| {
            format!(
                "copy {me} would launch with {}, copy {them} with {}",
                self.settings, other.settings
            )
        })
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
            dir: run_folder::job_root(root).join(component(&key)),
            source,
            timeout,
            handle: None,
            token: Default::default(),
            nonce: crate::untrusted::random_token(),
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

    /// Open the job's folder, before anything runs: `<root>/.oomguard-job`
    /// (the user's, writable by nobody else) and `<key>` in it (the user's
    /// and private, 0700), each created exclusively when absent and never
    /// through a link. Every later read, write and delete goes through the
    /// folder opened here (`/proc/self/fd/N/NAME`), so a folder swapped for
    /// a link or another user's meanwhile is never used.
    pub fn open(&mut self) -> Result<(), crate::run_folder::Unsafe> {
        let fd = open_job_dir(&self.dir)?;
        self.handle = Some(std::sync::Arc::new(fd));
        Ok(())
    }

    /// `name` in the job's folder, through the folder opened by [`Job::open`].
    fn at(&self, name: &str) -> PathBuf {
        match &self.handle {
            Some(fd) => {
                use std::os::fd::AsRawFd;
                PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())).join(name)
            }
            None => self.dir.join(name),
        }
    }

    fn folder(&self) -> PathBuf {
        self.at("")
    }

    fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        if self.handle.is_none() {
            return Err(std::io::Error::other(format!(
                "the job folder {} was not opened",
                self.dir.display()
            )));
        }
        write_into(&self.folder(), name, bytes)
    }

    /// A file of this job's copies: the user's own regular file, at most
    /// [`MAX_FILE`] bytes, opened without blocking or following a link.
    fn read<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Option<T> {
        self.handle.as_ref()?;
        let bytes =
            crate::untrusted::read(&self.at(name), MAX_FILE, crate::untrusted::Expect::own())
                .ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// A message of this job: read, and its token this job's.
    fn message<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Option<T> {
        let token = self.token.get()?;
        let m: Message<T> = self.read(name)?;
        (m.token == *token).then_some(m.body)
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

    /// The leader, before the first attempt: every file in the folder is an
    /// earlier job's (this job's token does not exist yet). The followers'
    /// `ready-1` files this removes are written again by their copies.
    pub fn clear_stale(&self) {
        if self.handle.is_none() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(self.folder()) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name.starts_with("ready-")
                || name.starts_with("end-")
                || name.starts_with("decision-")
                || name.starts_with("meeting-");
            // `unlink` of a name in the opened folder: never follows a link.
            if ours && e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
                let _ = std::fs::remove_file(self.at(&name));
            }
        }
    }

    /// The meeting before attempt `n`: every copy says it is ready and what it
    /// is about to launch (`me`; None: a copy that says nothing of it), and
    /// waits for the others. The first meeting gives the job its token: each
    /// follower's `ready-1-R` holds a random nonce of its own; copy 0, once
    /// every copy's is there, writes `meeting-1.json` with a new random token,
    /// the nonces it saw and its settings for attempt 1, which the followers
    /// adopt; a follower takes the token (and the settings) only from a meeting
    /// file that holds its own nonce — never from an earlier job's files with
    /// the same key. Later meetings and every message carry the token.
    ///
    /// The copies also check that they launch the same job ([`Launch`]): at
    /// the first meeting copy 0 checks each follower's (the same copies and
    /// world size, settings it can adopt) and says a disagreement in
    /// `meeting-1.json`; at a later one each copy compares the others' and
    /// writes a disagreement into its own `ready-N-R`, so the others stop too.
    /// Only files of this meeting count (the leader cleared the folder before
    /// the first, later ones carry the token), so a disagreement is said at
    /// once, never waited on.
    pub fn meet(&self, n: u32, me: Option<&Launch>) -> Met {
        let none = Met {
            all: false,
            start: None,
            disagree: None,
        };
        if n == 1 {
            return self.first_meeting(me).unwrap_or(none);
        }
        let Some(token) = self.token.get().cloned() else {
            return none;
        };
        let name = |r: u32| format!("ready-{n}-{r}");
        let write = |disagree: Option<String>| {
            let mine = Ready {
                token: token.clone(),
                nonce: String::new(),
                launch: me.cloned(),
                disagree,
            };
            self.write(
                &name(self.rank),
                &serde_json::to_vec(&mine).expect("Ready serialises"),
            )
        };
        if let Err(e) = write(None) {
            tracing::warn!("job folder {}: {e}", self.dir.display());
            return none;
        }
        let met = self.wait(|| {
            let mut all = true;
            for r in (0..self.copies).filter(|r| *r != self.rank) {
                let Some(other) = self.read::<Ready>(&name(r)).filter(|x| x.token == token) else {
                    all = false;
                    continue;
                };
                if let Some(why) = &other.disagree {
                    return Some(Err(format!("copy {r} of the job: {why}")));
                }
                if let (Some(me), Some(theirs)) = (me, &other.launch)
                    && let Some(why) = me.differs(theirs, self.rank, r, false)
                {
                    return Some(Err(why));
                }
            }
            all.then_some(Ok(()))
        });
        match met {
            Some(Ok(())) => Met { all: true, ..none },
            None => none,
            Some(Err(why)) => {
                let _ = write(Some(why.clone()));
                Met {
                    all: true,
                    disagree: Some(why),
                    ..none
                }
            }
        }
    }

    fn first_meeting(&self, me: Option<&Launch>) -> Option<Met> {
        let name = format!("ready-1-{}", self.rank);
        let mine = Ready {
            token: String::new(),
            nonce: self.nonce.clone(),
            launch: me.cloned(),
            disagree: None,
        };
        let bytes = serde_json::to_vec(&mine).expect("Ready serialises");
        let write = || {
            self.write(&name, &bytes)
                .inspect_err(|e| tracing::warn!("job folder {}: {e}", self.dir.display()))
                .ok()
        };
        if write().is_none() && self.leader() {
            return None;
        }
        if self.leader() {
            let token = crate::untrusted::random_token();
            let _ = self.token.set(token.clone());
            // The followers' nonces as they come; a follower that cannot launch
            // what copy 0 launches ends the wait at once.
            let mut seen: BTreeMap<u32, String> = BTreeMap::new();
            let mut disagree = None;
            let all = self
                .wait(|| {
                    for r in self.ready_ranks() {
                        if seen.contains_key(&r) {
                            continue;
                        }
                        let Some(x) = self
                            .read::<Ready>(&format!("ready-1-{r}"))
                            .filter(|x| !x.nonce.is_empty())
                        else {
                            continue;
                        };
                        seen.insert(r, x.nonce);
                        let why = match (me, &x.launch) {
                            _ if r >= self.copies => Some(format!(
                                "copy {r} came, but copy 0 counts {} copies",
                                self.copies
                            )),
                            (Some(me), Some(theirs)) => me.differs(theirs, 0, r, true),
                            _ => None,
                        };
                        if why.is_some() {
                            disagree = why;
                            return Some(());
                        }
                    }
                    (seen.len() + 1 >= self.copies as usize).then_some(())
                })
                .is_some();
            let meeting = MeetingFile {
                token,
                nonces: seen,
                start: me.map(|l| l.knobs.clone()),
                disagree: disagree.clone(),
            };
            if let Err(e) = self.write(
                "meeting-1.json",
                &serde_json::to_vec(&meeting).expect("Meeting serialises"),
            ) {
                tracing::warn!("job folder {}: {e}", self.dir.display());
            }
            return Some(Met {
                all,
                start: None,
                disagree,
            });
        }
        let meeting = self.wait(|| {
            let m: Option<MeetingFile> = self.read("meeting-1.json");
            match m {
                Some(m) if m.nonces.get(&self.rank) == Some(&self.nonce) => Some(m),
                _ => {
                    // The leader cleared an earlier job's files, ours among
                    // them if we came first: say again that we are here.
                    let here: Option<Ready> = self.read(&name);
                    if here.is_none_or(|r| r.nonce != self.nonce) {
                        write();
                    }
                    None
                }
            }
        })?;
        let _ = self.token.set(meeting.token);
        Some(Met {
            all: true,
            start: meeting.start.filter(|_| meeting.disagree.is_none()),
            disagree: meeting.disagree,
        })
    }

    /// The ranks of the `ready-1-R` files in the folder: the job's followers,
    /// and any copy that counts more copies than copy 0 does.
    fn ready_ranks(&self) -> Vec<u32> {
        let mut ranks: Vec<u32> = (1..self.copies).collect();
        if let Ok(entries) = std::fs::read_dir(self.folder()) {
            let extra = entries
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix("ready-1-")?
                        .parse()
                        .ok()
                })
                .filter(|r: &u32| *r >= self.copies)
                .take(64);
            ranks.extend(extra);
        }
        ranks
    }

    /// This copy's end of attempt `n`.
    pub fn publish_end(&self, n: u32, end: &End) -> std::io::Result<()> {
        self.publish(&format!("end-{n}-{}.json", self.rank), end)
    }

    fn publish<T: Serialize>(&self, name: &str, body: &T) -> std::io::Result<()> {
        let Some(token) = self.token.get() else {
            return Err(std::io::Error::other(
                "this copy never met copy 0 of the job, so it cannot speak for it",
            ));
        };
        let json = serde_json::to_vec(&Message {
            token: token.clone(),
            body,
        })
        .expect("a message serialises");
        self.write(name, &json)
    }

    /// The leader: the followers' ends of attempt `n`, as many as came within
    /// the timeout (it stops waiting as soon as one reports an OOM).
    pub fn await_ends(&self, n: u32) -> Vec<End> {
        let read = || -> Vec<End> {
            (1..self.copies)
                .filter_map(|r| self.message(&format!("end-{n}-{r}.json")))
                .collect()
        };
        self.wait(|| {
            let ends = read();
            let oom = ends.iter().any(|e| e.oom_line.is_some());
            (oom || ends.len() + 1 >= self.copies as usize).then_some(ends)
        })
        .unwrap_or_else(read)
    }

    /// The leader's decision after attempt `n`. A checkpoint is named by its
    /// absolute path: a copy started in another folder finds it too.
    pub fn publish_decision(&self, n: u32, d: &Published) -> std::io::Result<()> {
        let d = match d {
            Published::Relaunch { knobs, resume } => Published::Relaunch {
                knobs: knobs.clone(),
                resume: resume
                    .as_ref()
                    .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
            },
            other => other.clone(),
        };
        self.publish(&format!("decision-{n}.json"), &d)
    }

    /// A follower: the leader's decision after attempt `n`, or None after the timeout.
    pub fn await_decision(&self, n: u32) -> Option<Published> {
        self.wait(|| self.decision(n))
    }

    /// The leader's decision after attempt `n`, if it is there and this job's.
    fn decision(&self, n: u32) -> Option<Published> {
        self.message(&format!("decision-{n}.json"))
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
        self.handle.as_ref()?;
        // One listing of the folder, then only the files that are there (cheap on
        // a shared filesystem, whatever the number of copies).
        let prefix = format!("end-{n}-");
        let own = format!("end-{n}-{}.json", self.rank);
        let names: Vec<String> = std::fs::read_dir(self.folder())
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(&prefix) && name.ends_with(".json") && *name != own)
            .take(self.copies as usize)
            .collect();
        let ends: Vec<End> = names.iter().filter_map(|name| self.message(name)).collect();
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

/// The most oomguard reads of one job file.
const MAX_FILE: u64 = 1 << 20;

/// What a copy learns at a meeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Met {
    /// Every copy came within the timeout (or a disagreement ended the wait).
    pub all: bool,
    /// A follower at the first meeting: copy 0's settings for attempt 1.
    pub start: Option<BTreeMap<String, Value>>,
    /// The copies are not about to launch the same job: why. Nothing is
    /// launched.
    pub disagree: Option<String>,
}

/// `ready-N-R`: a copy's nonce at the first meeting, the job's token after;
/// what it is about to launch, and a disagreement it found (later meetings).
#[derive(Debug, Serialize, Deserialize)]
struct Ready {
    #[serde(default)]
    token: String,
    #[serde(default)]
    nonce: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    launch: Option<Launch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disagree: Option<String>,
}

/// `meeting-1.json`, written by copy 0.
#[derive(Debug, Serialize, Deserialize)]
struct MeetingFile {
    token: String,
    nonces: BTreeMap<u32, String>,
    #[serde(default)]
    start: Option<BTreeMap<String, Value>>,
    /// Copy 0 found a copy that cannot launch what it launches: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disagree: Option<String>,
}

/// A message of the job: counted only with the job's token.
#[derive(Debug, Serialize, Deserialize)]
struct Message<T> {
    token: String,
    body: T,
}

/// `dir` (`<root>/.oomguard-job/<key>`) opened as described at [`Job::open`].
fn open_job_dir(dir: &Path) -> Result<std::os::fd::OwnedFd, crate::run_folder::Unsafe> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, fstat, mkdirat};
    let unsafe_ = |path: &Path, why: String| crate::run_folder::Unsafe {
        path: path.to_path_buf(),
        why,
        advice: "The folder where the copies of a job meet must be yours and private (oomguard creates it so): remove it, or name another output folder",
    };
    let jobs = dir.parent().unwrap_or(Path::new("."));
    let root = jobs.parent().unwrap_or(Path::new("."));
    if let Err(e) = std::fs::create_dir_all(root) {
        return Err(unsafe_(root, format!("cannot be created ({e})")));
    }
    let root_fd = nix::fcntl::open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| unsafe_(root, format!("cannot be opened ({e})")))?;
    let sub = |parent: &std::os::fd::OwnedFd,
               name: &std::ffi::OsStr,
               shown: &Path,
               others: u32|
     -> Result<std::os::fd::OwnedFd, crate::run_folder::Unsafe> {
        match mkdirat(parent, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(unsafe_(shown, format!("cannot be created ({e})"))),
        }
        let fd = openat(
            parent,
            name,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            nix::errno::Errno::ELOOP => unsafe_(shown, "is a symbolic link".into()),
            nix::errno::Errno::ENOTDIR
                if std::fs::symlink_metadata(shown).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                unsafe_(shown, "is a symbolic link".into())
            }
            nix::errno::Errno::ENOTDIR => unsafe_(shown, "is not a folder".into()),
            e => unsafe_(shown, format!("cannot be opened ({e})")),
        })?;
        let st = fstat(&fd).map_err(|e| unsafe_(shown, format!("cannot be examined ({e})")))?;
        let me = crate::untrusted::euid();
        if st.st_uid != me {
            return Err(unsafe_(
                shown,
                format!("is owned by another user (uid {}, you are {me})", st.st_uid),
            ));
        }
        if st.st_mode & others != 0 {
            return Err(unsafe_(
                shown,
                format!("is open to others (mode {:o})", st.st_mode & 0o7777),
            ));
        }
        Ok(fd)
    };
    let jobs_fd = sub(&root_fd, jobs.file_name().unwrap_or_default(), jobs, 0o022)?;
    sub(&jobs_fd, dir.file_name().unwrap_or_default(), dir, 0o077)
}

/// Writes `dir/name` whole: a private file created new (never through a
/// link) renamed into place.
fn write_into(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        crate::untrusted::random_token()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let done = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// `previous-run` in a requeued job's new run folder: the old run folder's path.
pub fn write_previous_run(run_dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(crate::run_folder::RunFolder::at(run_dir).previous_run())?;
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
    Some(run_folder::fitting_in(
        &run_folder::job_root(root).join(component(&format!("slurm-{job}"))),
    ))
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
        return Some(run_folder::fitting_in(&j.dir));
    }
    let key =
        match crate::frameworks::launchers::torchrun_opt(cmd, env, &["--rdzv_id", "--rdzv-id"]) {
            Some(o) => format!("torchrun-{}", o.value),
            None if cmd.launcher(LauncherKind::Torchrun).is_some() => {
                format!("torchrun-{}", env_str(env, JOB_NAME)?)
            }
            None => format!("pods-{}", env_str(env, JOB_NAME)?),
        };
    Some(run_folder::fitting_in(
        &run_folder::job_root(root).join(component(&key)),
    ))
}

/// A finished job's settings are not a restart's: a job submitted again under
/// the same name starts as its command says.
/// The file is removed through its folder opened as a job's folder is (never
/// through a link, never in another user's folder).
pub fn forget_fitting(path: &Path) {
    if std::fs::symlink_metadata(path).is_err() {
        return;
    }
    let name = path.file_name().unwrap_or_default();
    if let Ok((dir, _fd)) = fitting_dir(path) {
        let _ = std::fs::remove_file(dir.join(name));
    }
}

/// How many times Slurm restarted this job (requeue, preemption).
pub fn restart_count(env: &dyn Fn(&str) -> Option<OsString>) -> u32 {
    env_u32(env, "SLURM_RESTART_COUNT").unwrap_or(0)
}

/// The folder of `path`, opened as a job's folder is ([`Job::open`]).
fn fitting_dir(path: &Path) -> Result<(PathBuf, std::os::fd::OwnedFd), crate::run_folder::Unsafe> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let fd = open_job_dir(dir)?;
    use std::os::fd::AsRawFd;
    Ok((
        PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        fd,
    ))
}

pub fn save_fitting(path: &Path, f: &Fitting) -> std::io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(run_folder::names::FITTING);
    let (dir, _fd) = fitting_dir(path).map_err(std::io::Error::other)?;
    write_into(
        &dir,
        name,
        &serde_json::to_vec(f).expect("Fitting serialises"),
    )
}

/// Why the job's last settings (`fitting.json`) are not used.
#[derive(Debug, thiserror::Error)]
pub enum FittingError {
    /// Its folder is not the user's own and private.
    #[error(transparent)]
    Folder(#[from] run_folder::Unsafe),
    /// A link, not a regular file, another user's, too large, or unreadable.
    /// `at`: the name it was opened by (through the folder's descriptor),
    /// shown as `path`.
    #[error("{}", shown(source, at, path))]
    Unreadable {
        path: PathBuf,
        at: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is open to others (mode {mode:o}); oomguard writes it 0600",
        path.display()
    )]
    OpenToOthers { path: PathBuf, mode: u32 },
    #[error("{} is not a fitting ({source})", path.display())]
    NotAFitting {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// `e`'s message with the name the file was opened by replaced by the one the
/// user knows.
fn shown(e: &std::io::Error, at: &Path, path: &Path) -> String {
    e.to_string()
        .replace(&at.display().to_string(), &path.display().to_string())
}

/// The job's last settings, when there are some: `Err` says why the file is
/// not used (its folder or the file is not the user's own and private, a
/// link, not a regular file, too large, not a fitting).
pub fn load_fitting(path: &Path) -> Result<Option<Fitting>, FittingError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    let name = path.file_name().unwrap_or_default();
    let (dir, _fd) = fitting_dir(path)?;
    let at = dir.join(name);
    let unreadable = |source| FittingError::Unreadable {
        path: path.to_path_buf(),
        at: at.clone(),
        source,
    };
    let (_, m) =
        crate::untrusted::open(&at, crate::untrusted::Expect::own()).map_err(unreadable)?;
    {
        use std::os::unix::fs::MetadataExt;
        if m.mode() & 0o077 != 0 {
            return Err(FittingError::OpenToOthers {
                path: path.to_path_buf(),
                mode: m.mode() & 0o7777,
            });
        }
    }
    let bytes = crate::untrusted::read(&at, MAX_FILE, crate::untrusted::Expect::own())
        .map_err(unreadable)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| FittingError::NotAFitting {
            path: path.to_path_buf(),
            source,
        })
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
        let mut j = Job {
            rank,
            copies: 2,
            dir: dir.to_path_buf(),
            source: String::new(),
            timeout: Duration::from_secs(20),
            handle: None,
            token: Default::default(),
            nonce: crate::untrusted::random_token(),
        };
        j.open().unwrap();
        j
    }

    #[test]
    fn a_follower_waits_for_the_leaders_decision_and_both_meet() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let (leader, follower) = (job(&dir, 0), job(&dir, 1));
        let f = std::thread::spawn(move || {
            assert!(follower.meet(1, None).all);
            let end = End {
                rank: 1,
                outcome: OutcomeKind::CudaOom,
                oom_line: Some("torch.OutOfMemoryError: CUDA out of memory.".into()),
            };
            follower.publish_end(1, &end).unwrap();
            let d = follower.await_decision(1).expect("a decision");
            assert!(follower.meet(2, None).all);
            d
        });
        leader.clear_stale();
        assert!(leader.meet(1, None).all);
        let ends = leader.await_ends(1);
        assert_eq!(ends.len(), 1);
        assert_eq!(ends[0].outcome, OutcomeKind::CudaOom);
        let d = Published::Relaunch {
            knobs: BTreeMap::from([(Knob::MicroBatch, Value::Int(4))]),
            resume: Some(PathBuf::from("/shared/out/checkpoint-5")),
        };
        leader.publish_decision(1, &d).unwrap();
        assert!(leader.meet(2, None).all);
        assert_eq!(f.join().unwrap(), d);
    }

    #[test]
    fn the_fitting_settings_survive_a_requeue() {
        let t = tempfile::tempdir().unwrap();
        let env = env(&[("SLURM_JOB_ID", "9"), ("SLURM_RESTART_COUNT", "1")]);
        let path = fitting_path(&env, t.path()).unwrap();
        assert!(path.ends_with(".oomguard-job/slurm-9/fitting.json"));
        assert_eq!(restart_count(&env), 1);
        assert_eq!(load_fitting(&path).unwrap(), None);
        let f = Fitting {
            knobs: BTreeMap::from([("micro_batch".to_string(), Value::Int(4))]),
            run_dir: PathBuf::from("/runs/a"),
        };
        save_fitting(&path, &f).unwrap();
        save_fitting(&path, &f).unwrap();
        assert_eq!(load_fitting(&path).unwrap(), Some(f));
    }

    #[test]
    fn a_running_copy_hears_that_the_job_moved_on() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let (leader, follower) = (job(&dir, 0), job(&dir, 1));
        // A decision an earlier job with the same key left, dated in the future:
        // without this job's token it is not this job's.
        let d = Published::Relaunch {
            knobs: BTreeMap::new(),
            resume: None,
        };
        let earlier = job(&dir, 0);
        let _ = earlier.token.set("an earlier job".into());
        earlier.publish_decision(1, &d).unwrap();
        let later = std::time::SystemTime::now() + Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(dir.join("decision-1.json"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        // Stale ready files of that job do not make a meeting.
        std::fs::write(dir.join("ready-1-0"), b"").unwrap();
        std::fs::write(dir.join("ready-1-1"), b"").unwrap();
        let mut alone = job(&dir, 1);
        alone.timeout = Duration::from_millis(300);
        assert!(!alone.meet(1, None).all, "a meeting of stale files");
        std::thread::scope(|s| {
            s.spawn(|| assert!(follower.meet(1, None).all));
            leader.clear_stale();
            let start = launch(2, 8, 4, 2);
            assert!(leader.meet(1, Some(&start)).all);
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

    /// What a copy of `copies` launches with world size `world`, micro-batch
    /// `micro` and accumulation `accum`.
    fn launch(copies: u32, world: u64, micro: u64, accum: u64) -> Launch {
        let knobs = BTreeMap::from([
            ("grad_accum".to_string(), Value::Int(accum)),
            ("micro_batch".to_string(), Value::Int(micro)),
        ]);
        Launch {
            copies,
            world,
            knobs,
            global_batch: Some(micro * accum * world),
            settings: format!("grad_accum={accum} micro_batch={micro}"),
        }
    }

    #[test]
    fn followers_adopt_copy_0s_settings_and_copies_that_cannot_disagree() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let (leader, follower) = (job(&dir, 0), job(&dir, 1));
        // An earlier job's files with the same key, one of them dated in the
        // future and disagreeing: no date is trusted, and none counts.
        let earlier = job(&dir, 1);
        let _ = earlier.token.set("an earlier job".into());
        std::fs::write(
            dir.join("ready-1-1"),
            serde_json::to_vec(&Ready {
                token: String::new(),
                nonce: "an earlier job's".into(),
                launch: Some(launch(3, 8, 16, 1)),
                disagree: None,
            })
            .unwrap(),
        )
        .unwrap();
        let later = std::time::SystemTime::now() + Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(dir.join("ready-1-1"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        // Other settings of the same global batch: copy 1 adopts copy 0's.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                let m = follower.meet(1, Some(&launch(2, 8, 16, 2)));
                assert!(m.all && m.disagree.is_none(), "{m:?}");
                assert_eq!(m.start, Some(launch(2, 8, 4, 8).knobs));
            });
            leader.clear_stale();
            let m = leader.meet(1, Some(&launch(2, 8, 4, 8)));
            assert!(m.all && m.disagree.is_none(), "{m:?}");
        });
        // An earlier job's disagreement at a later meeting (no token) is not
        // this job's; this job's copies that launch differently both say so at
        // once.
        std::fs::write(
            dir.join("ready-2-1"),
            serde_json::to_vec(&Ready {
                token: "an earlier job".into(),
                nonce: String::new(),
                launch: None,
                disagree: Some("an earlier job's".into()),
            })
            .unwrap(),
        )
        .unwrap();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                let m = follower.meet(2, Some(&launch(2, 8, 2, 16)));
                let w = m.disagree.unwrap_or_default();
                assert!(w.contains("micro_batch=4") && !w.contains("earlier"), "{w}");
            });
            let m = leader.meet(2, Some(&launch(2, 8, 4, 8)));
            let w = m.disagree.unwrap_or_default();
            assert!(w.contains("micro_batch=2") && !w.contains("earlier"), "{w}");
        });
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn copies_that_cannot_launch_copy_0s_job_stop_at_the_first_meeting() {
        // (copy 0's, copy 1's, what the disagreement names)
        let cases = [
            (launch(2, 8, 16, 2), launch(2, 8, 8, 2), "global batch"),
            (launch(2, 8, 4, 8), launch(3, 8, 4, 8), "copy 1 counts 3"),
            (launch(2, 8, 4, 8), launch(2, 16, 2, 8), "copy 1 has 16"),
        ];
        for (mine, theirs, said) in cases {
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join("job");
            let (leader, follower) = (job(&dir, 0), job(&dir, 1));
            let t0 = Instant::now();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let m = follower.meet(1, Some(&theirs));
                    let w = m.disagree.unwrap_or_default();
                    assert!(w.contains(said) && m.start.is_none(), "{w}");
                    assert!(
                        follower
                            .publish_end(
                                1,
                                &End {
                                    rank: 1,
                                    outcome: OutcomeKind::OtherFailure,
                                    oom_line: None,
                                }
                            )
                            .is_ok()
                    );
                });
                leader.clear_stale();
                let m = leader.meet(1, Some(&mine));
                let w = m.disagree.unwrap_or_default();
                assert!(w.contains(said), "{w}");
            });
            assert!(t0.elapsed() < Duration::from_secs(10));
        }
        // A copy that counts more copies than copy 0 (rank 2 of 3, copy 0
        // counts 2) hears it too.
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job");
        let leader = job(&dir, 0);
        let mut third = job(&dir, 2);
        third.copies = 3;
        std::thread::scope(|s| {
            s.spawn(|| {
                let m = third.meet(1, Some(&launch(3, 8, 4, 8)));
                assert!(m.disagree.is_some_and(|w| w.contains("copy 2")));
            });
            leader.clear_stale();
            let m = leader.meet(1, Some(&launch(2, 8, 4, 8)));
            assert!(
                m.disagree.as_ref().is_some_and(|w| w.contains("copy 2")),
                "{m:?}"
            );
        });
    }

    #[test]
    fn waits_are_bounded() {
        let t = tempfile::tempdir().unwrap();
        let mut j = job(&t.path().join("j"), 1);
        j.timeout = Duration::from_millis(200);
        assert_eq!(j.await_decision(3), None);
        assert!(!j.meet(3, None).all);
        assert!(!j.meet(1, None).all);
    }
}
