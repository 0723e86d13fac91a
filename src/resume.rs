//! Where the next attempt resumes from.
//!
//! Theory of operation. A relaunch continues this run: it resumes from the
//! newest complete checkpoint this run wrote, never from an older experiment's
//! in the same folder. So the [`Resumer`] takes a *baseline* of what is there
//! as the first attempt starts (as late as possible: a wait for GPU memory can
//! be long), learns from each attempt which saves the trainer announced and
//! which step it reached (a checkpoint beyond it is not this run's), and
//! between attempts searches the layout, watching each candidate for a short
//! *settle* interval (a save the dying attempt was writing must not be taken
//! half-written). It keeps the checkpoint the next attempt resumes from and
//! its step, which is the step that attempt *started from*.
//!
//! A search returns a typed [`Resumption`]; [`Because`] is rendered as prose
//! only where it is shown (the terminal, `plan`).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::checkpoint::{self, Baseline, Checkpoint, Found, Layout, ResumeHow, SkipKind};
use crate::detect::saves::Announced;
use crate::knobs::ResumeArg;

/// How long a candidate is watched for changes between attempts. The previous
/// attempt's process group is gone by then, so a checkpoint it was writing is
/// as complete as it will ever be; the interval catches another process
/// still writing (a second trainer, a sync) without delaying a relaunch.
pub const SETTLE: Duration = Duration::from_millis(200);

/// What a search decided, and why.
#[derive(Debug, Clone)]
pub struct Resumption {
    /// What the search found (`None`: no checkpoint layout in the command).
    pub found: Option<Found>,
    /// The checkpoint chosen, if any.
    pub chosen: Option<Checkpoint>,
    /// How the command is told (`None`: run it as the user wrote it).
    pub arg: Option<ResumeArg>,
    pub because: Because,
}

impl Resumption {
    /// The step of the checkpoint chosen.
    pub fn step(&self) -> Option<u64> {
        self.chosen.as_ref().and_then(checkpoint::step_for)
    }
}

/// Why the next attempt resumes where it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Because {
    /// No checkpoint folder in the command: every attempt starts from the beginning.
    NoLayout,
    /// The newest complete checkpoint this run wrote.
    Newest {
        path: PathBuf,
        /// The command resumes from its folder by itself (no argument added).
        automatic: bool,
    },
    /// No complete checkpoint this run wrote under `root` yet: the next
    /// attempt starts as the first did.
    NoneYet { root: PathBuf, starts: StartsAs },
    /// The newest checkpoint cannot be loaded at the next settings (see
    /// `loadable`): the next attempt starts from the beginning, unless the command
    /// finds a checkpoint by itself (`starts`).
    StartsOver {
        why: crate::loadable::Unloadable,
        starts: StartsAs,
    },
    /// The command cannot be told where to resume (its parser lacks the flag the
    /// layout's family adds: `why`): every attempt starts from the beginning.
    NotAccepted(String),
}

/// How an attempt starts without a checkpoint of this run's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartsAs {
    /// The command resumes from its folder by itself.
    Automatic,
    /// From the user's own resume argument.
    UserArgument(PathBuf),
    /// From the checkpoint the script found in its folder by itself as the first
    /// attempt started (see `checkpoint::OwnSearch`), named on the command line.
    OwnPick(PathBuf),
    Fresh,
}

impl fmt::Display for Because {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Because::NoLayout => write!(
                f,
                "no checkpoint folder in the command (looked for {}): each attempt starts from the beginning; a policy's [resume] table describes a custom layout",
                crate::frameworks::output_hints()
            ),
            Because::Newest {
                path,
                automatic: true,
            } => write!(
                f,
                "{} is the newest complete checkpoint this run wrote; the command resumes from its folder by itself",
                path.display()
            ),
            Because::Newest {
                path,
                automatic: false,
            } => write!(
                f,
                "resume from {} (the newest complete checkpoint this run wrote)",
                path.display()
            ),
            Because::NoneYet { root, starts } => {
                write!(
                    f,
                    "no complete checkpoint written by this run under {} yet: ",
                    root.display()
                )?;
                match starts {
                    StartsAs::Automatic => f.write_str(
                        "the command resumes from its folder by itself, as the first attempt did",
                    ),
                    StartsAs::UserArgument(u) => write!(
                        f,
                        "keep your resume argument {}, as the first attempt did",
                        u.display()
                    ),
                    StartsAs::OwnPick(p) => write!(
                        f,
                        "resume from {}, which the script found in its folder by itself as the first attempt started (named, so that the script does not take a newer one this run left half-written)",
                        p.display()
                    ),
                    StartsAs::Fresh => f.write_str("start fresh, as the first attempt did"),
                }
            }
            Because::NotAccepted(why) => write!(
                f,
                "{why}: oomguard cannot tell it where to resume, so each attempt starts from the beginning and trains the steps before it again (a policy's [resume] table describes another way the script resumes)"
            ),
            Because::StartsOver { why, starts } => {
                write!(f, "{why}: ")?;
                match starts {
                    StartsAs::Fresh => f.write_str(
                        "the next attempt starts from the beginning, and the steps this run made are trained again",
                    ),
                    StartsAs::Automatic => f.write_str(
                        "the command resumes from its folder by itself and will try to load it; move this run's checkpoints out of the folder for the relaunch to start from the beginning",
                    ),
                    StartsAs::UserArgument(u) => write!(
                        f,
                        "the next attempt runs the command as written, from your resume argument {} (if it too was written before the change, it fails to load the same way)",
                        u.display()
                    ),
                    StartsAs::OwnPick(p) => write!(
                        f,
                        "the next attempt resumes from {}, which the script found by itself as the first attempt started (if it too was written before the change, it fails to load the same way)",
                        p.display()
                    ),
                }
            }
        }
    }
}

/// How an attempt starts without a checkpoint of this run's, by `layout`: by itself
/// (automatic), from the user's resume argument, else from what the script found by
/// itself as the first attempt started, else fresh.
fn starts_as(layout: &Layout) -> StartsAs {
    if layout.how == ResumeHow::Automatic {
        return StartsAs::Automatic;
    }
    match (
        &layout.user_resume,
        layout.own.as_ref().and_then(|o| o.picked.as_ref()),
    ) {
        (Some(u), _) => StartsAs::UserArgument(u.clone()),
        (None, Some(p)) => StartsAs::OwnPick(p.clone()),
        (None, None) => StartsAs::Fresh,
    }
}

/// A half-written checkpoint of this run's, moved out of the way of the script's own
/// search (see [`Resumer::move_aside_half_written`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedAside {
    pub from: PathBuf,
    pub to: PathBuf,
    /// Why it is not complete.
    pub why: String,
}

/// The resume point of a run (see the module's theory of operation).
#[derive(Debug, Clone)]
pub struct Resumer {
    layout: Option<Layout>,
    /// Why the command cannot be told where to resume (see [`Because::NotAccepted`]).
    refused: Option<String>,
    baseline: Baseline,
    settle: Duration,
    /// Where the next attempt resumes from. The first attempt runs the command
    /// as given: a resume argument the user wrote stays theirs.
    next: Option<ResumeArg>,
    /// The step of that checkpoint.
    step: Option<u64>,
    /// The command refused the flag that turns its own folder search off.
    off_refused: bool,
}

impl Resumer {
    /// A run's resumer: nothing counts as present before the run until
    /// [`Resumer::take_baseline`]; candidates are watched for `settle`.
    pub fn new(layout: Option<Layout>, settle: Duration) -> Resumer {
        Resumer {
            layout,
            refused: None,
            baseline: Baseline::default(),
            settle,
            next: None,
            step: None,
            off_refused: false,
        }
    }

    /// The command cannot be told where to resume (`why`; `None`: it can).
    pub fn refusing(mut self, why: Option<String>) -> Resumer {
        self.refused = why;
        self
    }

    /// The command refused `added`, an argument oomguard added to resume (`why`): the
    /// resume argument, after which it is never told where to resume and the next
    /// attempt starts from the beginning; or the flag that turns its own folder search
    /// off, which is then never carried again.
    pub fn refuse(&mut self, why: String, added: &str) {
        if self.relaunch_flags().iter().any(|f| f == added) {
            self.off_refused = true;
            return;
        }
        self.refused = Some(why);
        self.next = None;
        self.step = None;
    }

    /// `plan`'s view: the checkpoints there now are not the run's, and nothing
    /// is watched.
    pub fn now(layout: Option<Layout>) -> Resumer {
        let mut r = Resumer::new(layout, Duration::ZERO);
        r.take_baseline();
        r
    }

    /// What is there now is not this run's: taken as the first attempt starts.
    pub fn take_baseline(&mut self) {
        self.baseline = Baseline::take(self.layout.as_ref());
    }

    /// The checkpoints an attempt's output announced it saved.
    pub fn note_announced(&mut self, saves: &[Announced]) {
        self.baseline.note_announced(saves);
    }

    /// This run reached step `bound` at most: a checkpoint of a later step is
    /// another run's.
    pub fn note_reached(&mut self, bound: u64) {
        self.baseline.reached = Some(self.baseline.reached.map_or(bound, |x| x.max(bound)));
    }

    /// The newest complete checkpoint this run wrote, watched for the settle
    /// interval. Without one, the next attempt starts as the first did: from
    /// the user's own resume argument if they gave one, else fresh.
    pub fn search(&self) -> Resumption {
        self.search_in(&self.baseline, self.settle)
    }

    /// [`Resumer::search`] as if this run had reached `reached` at most (the
    /// attempt that just ended printed it), without watching: what the attempt
    /// saved, not yet where to resume.
    pub fn search_reached(&self, reached: Option<u64>) -> Resumption {
        let mut bounded = self.baseline.clone();
        if let Some(r) = reached {
            bounded.reached = Some(r.max(bounded.reached.unwrap_or(0)));
        }
        self.search_in(&bounded, Duration::ZERO)
    }

    /// The newest complete checkpoint of any run, watched: a requeued job's
    /// checkpoints are its own, from before this run folder existed.
    pub fn search_any(&self) -> Resumption {
        self.search_in(&Baseline::default(), self.settle)
    }

    fn search_in(&self, baseline: &Baseline, settle: Duration) -> Resumption {
        let Some(layout) = &self.layout else {
            return Resumption {
                found: None,
                chosen: None,
                arg: None,
                because: Because::NoLayout,
            };
        };
        let found = checkpoint::find(layout, baseline, settle);
        if let Some(why) = &self.refused {
            return Resumption {
                found: Some(found),
                chosen: None,
                arg: None,
                because: Because::NotAccepted(why.clone()),
            };
        }
        // Anything this run wrote continues it, so it wins over the user's
        // resume argument (where the first attempt began).
        let chosen = found.latest.clone();
        let automatic = layout.how == ResumeHow::Automatic;
        let because = match (&chosen, &layout.user_resume) {
            (Some(c), _) => Because::Newest {
                path: c.path.clone(),
                automatic,
            },
            (None, _) => Because::NoneYet {
                root: layout.root.clone(),
                starts: starts_as(layout),
            },
        };
        let named = chosen
            .as_ref()
            .map(|c| c.path.clone())
            .or_else(|| match &because {
                Because::NoneYet {
                    starts: StartsAs::OwnPick(p),
                    ..
                } => Some(p.clone()),
                _ => None,
            });
        Resumption {
            arg: named.map(|path| ResumeArg {
                how: layout.how.clone(),
                path: path.into_os_string(),
            }),
            found: Some(found),
            chosen,
            because,
        }
    }

    /// The next attempt resumes where `r` says (and `step` is its step);
    /// without a checkpoint to resume from, the step resumed from stays.
    pub fn resume_from(&mut self, r: &Resumption, step: Option<u64>) {
        self.next = r.arg.clone();
        if r.arg.is_some() {
            self.step = step;
        }
    }

    /// The newest checkpoint `r` chose cannot be loaded at the next settings
    /// (`why`): the next attempt runs the command as written, from the step it
    /// started from the first time.
    pub fn start_over(&mut self, r: &mut Resumption, why: crate::loadable::Unloadable) {
        let starts = self.layout.as_ref().map_or(StartsAs::Fresh, starts_as);
        r.chosen = None;
        r.arg = match (&starts, &self.layout) {
            (StartsAs::OwnPick(p), Some(l)) => Some(ResumeArg {
                how: l.how.clone(),
                path: p.clone().into_os_string(),
            }),
            _ => None,
        };
        r.because = Because::StartsOver { why, starts };
        self.next = r.arg.clone();
        self.step = None;
    }

    /// The flags every relaunch carries besides its settings and where it resumes:
    /// the one that turns a script's own folder search off (see
    /// `checkpoint::OwnSearch`), until the command refuses it.
    pub fn relaunch_flags(&self) -> Vec<String> {
        if self.off_refused {
            return Vec::new();
        }
        self.layout
            .as_ref()
            .and_then(|l| l.own.as_ref())
            .and_then(|o| o.off.clone())
            .into_iter()
            .collect()
    }

    /// Before a relaunch told no checkpoint (this run has none complete, and the script
    /// picked none as it first started), of a script that searches its folder by itself
    /// with nothing carried to turn the search off (transformers 5's examples and the
    /// recipes copied from them: `get_last_checkpoint`, the highest-numbered
    /// `checkpoint-N` whole or not, and no `--overwrite_output_dir`): the search would
    /// load the checkpoint this run left half-written (an OOM while saving) and the
    /// relaunch would die on it. Each such folder of this run's is renamed
    /// `oomguard-incomplete-checkpoint-N` beside it, never deleted: the search passes it
    /// over and the trainer writes that step anew. `Err`: a rename that failed, said.
    pub fn move_aside_half_written(&self) -> Vec<Result<MovedAside, String>> {
        let Some(layout) = &self.layout else {
            return Vec::new();
        };
        if self.next.is_some()
            || layout.own.is_none()
            || layout.user_resume.is_some()
            || !self.relaunch_flags().is_empty()
        {
            return Vec::new();
        }
        let found = checkpoint::find(layout, &self.baseline, Duration::ZERO);
        found
            .skipped
            .iter()
            .filter(|s| s.kind == SkipKind::Incomplete)
            .filter(|s| {
                s.path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| checkpoint::step_in_name(n, "checkpoint-", ""))
                    .is_some()
            })
            .map(|s| {
                let name = s.path.file_name().unwrap_or_default().to_string_lossy();
                let to = (1..)
                    .map(|k| {
                        let n = if k == 1 {
                            format!("oomguard-incomplete-{name}")
                        } else {
                            format!("oomguard-incomplete-{name}-{k}")
                        };
                        s.path.with_file_name(n)
                    })
                    .find(|p| !p.exists())
                    .unwrap_or_default();
                std::fs::rename(&s.path, &to)
                    .map(|()| MovedAside {
                        from: s.path.clone(),
                        to: to.clone(),
                        why: s.why.clone(),
                    })
                    .map_err(|e| {
                        format!(
                            "could not move {} aside to {}: {e}; the script's own search may load it",
                            s.path.display(),
                            to.display()
                        )
                    })
            })
            .collect()
    }

    /// The next attempt resumes from `path`, as copy 0 of the job decided
    /// (`None`: as the user wrote the command).
    pub fn follow(&mut self, path: Option<PathBuf>) {
        self.next = match (path, &self.layout) {
            (Some(p), Some(l)) => Some(ResumeArg {
                how: l.how.clone(),
                path: p.into_os_string(),
            }),
            _ => None,
        };
    }

    /// How the next attempt is told where to resume (`None`: as written).
    pub fn next(&self) -> Option<&ResumeArg> {
        self.next.as_ref()
    }

    /// The step of the checkpoint the next attempt resumes from, when it
    /// resumes from one this run chose.
    pub fn resumed_step(&self) -> Option<u64> {
        self.step
    }

    /// The step the attempt began from: the checkpoint it resumed from, else
    /// the user's own resume argument's, else 0.
    pub fn started_from(&self) -> u64 {
        self.step
            .or_else(|| {
                let l = self.layout.as_ref()?;
                let user = l
                    .user_resume
                    .as_ref()
                    .or_else(|| l.own.as_ref()?.picked.as_ref())?;
                checkpoint::recorded_step(user)
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    /// A Hugging Face output folder `root` with a complete checkpoint at `step`.
    fn hf_checkpoint(root: &Path, step: u64) -> PathBuf {
        let d = root.join(format!("checkpoint-{step}"));
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join("trainer_state.json"),
            format!("{{\"global_step\": {step}}}"),
        )
        .unwrap();
        // A whole safetensors file: its header and every tensor's bytes.
        let header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let mut st = (header.len() as u64).to_le_bytes().to_vec();
        st.extend_from_slice(header.as_bytes());
        st.extend_from_slice(&[0; 4]);
        fs::write(d.join("model.safetensors"), st).unwrap();
        d
    }

    fn layout(root: &Path) -> Layout {
        let cmd = crate::command::Command::parse(
            &["python", "train.py", "--output_dir"]
                .iter()
                .map(Into::into)
                .chain([root.as_os_str().to_os_string()])
                .collect::<Vec<_>>(),
        );
        let disc = crate::knobs::discover(&cmd, &[], &|_| None, &|p| p.to_path_buf()).unwrap();
        crate::knobs::layout(&cmd, &disc, None).expect("an HF output folder is a layout")
    }

    #[test]
    fn a_half_written_checkpoint_is_moved_out_of_the_way_of_a_search_nothing_turns_off() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        fs::create_dir_all(&root).unwrap();
        let mut l = layout(&root);
        l.own = Some(crate::checkpoint::OwnSearch {
            picked: None,
            off: None,
        });
        let mut r = Resumer::new(Some(l.clone()), Duration::ZERO);
        r.take_baseline();
        // This run's save died after the weights: no trainer_state.json.
        let half = root.join("checkpoint-4");
        fs::create_dir_all(&half).unwrap();
        fs::write(half.join("model.safetensors"), b"x").unwrap();
        let res = r.search();
        r.resume_from(&res, res.step());
        assert!(r.next().is_none());
        let moved = r.move_aside_half_written();
        let to = root.join("oomguard-incomplete-checkpoint-4");
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].as_ref().unwrap().to, to);
        assert!(!half.exists() && to.join("model.safetensors").exists());
        // Again, the same step half-written: a second name, nothing overwritten.
        fs::create_dir_all(&half).unwrap();
        fs::write(half.join("model.safetensors"), b"x").unwrap();
        let moved = r.move_aside_half_written();
        assert_eq!(
            moved[0].as_ref().unwrap().to,
            root.join("oomguard-incomplete-checkpoint-4-2")
        );
        // Where the flag that turns the search off is carried, or a checkpoint is
        // named, nothing is moved.
        fs::create_dir_all(&half).unwrap();
        fs::write(half.join("model.safetensors"), b"x").unwrap();
        l.own = Some(crate::checkpoint::OwnSearch {
            picked: None,
            off: Some("--overwrite_output_dir".into()),
        });
        let mut r = Resumer::new(Some(l), Duration::ZERO);
        r.take_baseline();
        assert!(r.move_aside_half_written().is_empty());
        assert!(half.exists());
    }

    #[test]
    fn without_a_layout_every_attempt_starts_from_the_beginning() {
        let r = Resumer::new(None, SETTLE);
        let res = r.search();
        assert!(res.found.is_none() && res.arg.is_none());
        assert_eq!(res.because, Because::NoLayout);
        assert!(res.because.to_string().starts_with("no checkpoint folder"));
        assert_eq!(r.started_from(), 0);
    }

    #[test]
    fn a_script_that_picks_its_own_checkpoint_is_told_it_by_name_until_this_run_writes_one() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        let picked = hf_checkpoint(&root, 100);
        let mut l = layout(&root);
        l.own = Some(crate::checkpoint::OwnSearch {
            picked: Some(picked.clone()),
            off: Some("--overwrite_output_dir".into()),
        });
        let mut r = Resumer::new(Some(l), Duration::ZERO);
        r.take_baseline();
        assert_eq!(
            r.relaunch_flags(),
            vec!["--overwrite_output_dir".to_string()]
        );
        // This run's half-written checkpoint-200 is passed over; the script's own pick is named.
        fs::create_dir_all(root.join("checkpoint-200")).unwrap();
        let res = r.search();
        assert_eq!(res.chosen, None);
        assert_eq!(
            res.arg.as_ref().map(|a| PathBuf::from(&a.path)),
            Some(picked.clone())
        );
        assert!(
            matches!(&res.because, Because::NoneYet { starts: StartsAs::OwnPick(p), .. } if *p == picked)
        );
        r.resume_from(&res, res.step());
        assert_eq!(r.next().map(|a| PathBuf::from(&a.path)), Some(picked));
        assert_eq!(r.started_from(), 100);
        // Once this run writes a complete one, that one.
        let new = hf_checkpoint(&root, 300);
        assert_eq!(r.search().arg.map(|a| PathBuf::from(a.path)), Some(new));
        // The command refused the resume flag: the flag that turns its search off is
        // still carried; refused itself, it is never carried again.
        r.refuse("refused".into(), "--resume_from_checkpoint");
        assert_eq!(
            r.relaunch_flags(),
            vec!["--overwrite_output_dir".to_string()]
        );
        r.refuse("refused".into(), "--overwrite_output_dir");
        assert!(r.relaunch_flags().is_empty());
    }

    #[test]
    fn the_baseline_excludes_checkpoints_older_than_the_run() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        hf_checkpoint(&root, 100);
        let mut r = Resumer::new(Some(layout(&root)), Duration::ZERO);
        r.take_baseline();
        let res = r.search();
        assert_eq!(res.chosen, None, "{res:?}");
        assert_eq!(
            res.because,
            Because::NoneYet {
                root: root.clone(),
                starts: StartsAs::Fresh
            }
        );
        assert_eq!(res.found.as_ref().unwrap().ignored.len(), 1);
        // One this run writes is taken, with its step.
        let new = hf_checkpoint(&root, 200);
        let res = r.search();
        assert_eq!(
            res.chosen.as_ref().map(|c| c.path.clone()),
            Some(new.clone())
        );
        assert_eq!(res.step(), Some(200));
        assert_eq!(
            res.because.to_string(),
            format!(
                "resume from {} (the newest complete checkpoint this run wrote)",
                new.display()
            )
        );
        r.resume_from(&res, res.step());
        assert_eq!(r.next().map(|a| PathBuf::from(&a.path)), Some(new));
        assert_eq!((r.resumed_step(), r.started_from()), (Some(200), 200));
        // Any run's checkpoints count for a requeued job.
        assert!(r.search_any().chosen.is_some());
    }

    #[test]
    fn an_incomplete_checkpoint_is_skipped_for_the_complete_one_before_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        fs::create_dir_all(&root).unwrap();
        let mut r = Resumer::new(Some(layout(&root)), Duration::ZERO);
        r.take_baseline();
        let good = hf_checkpoint(&root, 10);
        let half = root.join("checkpoint-20");
        fs::create_dir_all(&half).unwrap();
        let res = r.search();
        assert_eq!(res.chosen.map(|c| c.path), Some(good));
        let skipped = &res.found.unwrap().skipped;
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].path, half);
        assert_eq!(skipped[0].kind, checkpoint::SkipKind::Incomplete);
    }

    #[test]
    fn a_checkpoint_beyond_the_step_reached_is_not_this_runs() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        fs::create_dir_all(&root).unwrap();
        let mut r = Resumer::new(Some(layout(&root)), Duration::ZERO);
        r.take_baseline();
        let mine = hf_checkpoint(&root, 10);
        hf_checkpoint(&root, 500);
        assert_eq!(r.search_reached(Some(20)).step(), Some(10));
        r.note_reached(20);
        assert_eq!(r.search().chosen.map(|c| c.path), Some(mine));
    }

    #[test]
    fn settle_watches_a_candidate_and_skips_one_being_written() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        fs::create_dir_all(&root).unwrap();
        let mut r = Resumer::new(Some(layout(&root)), SETTLE);
        r.take_baseline();
        let older = hf_checkpoint(&root, 10);
        let busy = hf_checkpoint(&root, 20);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (stop, busy) = (stop.clone(), busy.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    // The optimizer's state, still growing.
                    fs::write(busy.join("optimizer.pt"), "x".repeat(n as usize)).unwrap();
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        let t0 = std::time::Instant::now();
        let res = r.search();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(t0.elapsed() >= SETTLE, "it watched for the settle interval");
        assert_eq!(res.chosen.map(|c| c.path), Some(older));
        let skipped = res.found.unwrap().skipped;
        assert_eq!(skipped[0].path, busy);
        assert_eq!(skipped[0].kind, checkpoint::SkipKind::BeingWritten);
    }

    #[test]
    fn a_followed_decision_resumes_the_way_the_layout_does() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("out");
        let mut r = Resumer::new(Some(layout(&root)), SETTLE);
        r.follow(Some(root.join("checkpoint-5")));
        assert_eq!(
            r.next().map(|a| PathBuf::from(&a.path)),
            Some(root.join("checkpoint-5"))
        );
        r.follow(None);
        assert!(r.next().is_none());
        assert_eq!(Resumer::new(None, SETTLE).next(), None);
    }
}
