//! The words the run's record and its readers share: durations as the summary
//! and `status` say them, and the stretches of time lost to OOMs ([`Setback`])
//! with their one figure. A leaf: it names no stage of the pipeline (the
//! journal itself is `report::journal`, the end summary `report::summary`).

pub use crate::events::{SetbackState, knob_values, lossy};
pub use crate::report::journal::Journal;
pub use crate::run_folder::{create_private_dir, write_private};

/// "4.2 s", "3m 05s", "2h 03m", "1d 04h".
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let t = s as u64;
    match t {
        ..3600 => format!("{}m {:02}s", t / 60, t % 60),
        3600..86400 => format!("{}h {:02}m", t / 3600, t % 3600 / 60),
        _ => format!("{}d {:02}h", t / 86400, t % 86400 / 3600),
    }
}

/// One stretch of time lost to OOMs, in memory (see [`Event::TimeLost`]).
#[derive(Debug, Clone)]
pub struct Setback {
    pub ooms: Vec<u32>,
    pub step: Option<u64>,
    pub since: std::time::SystemTime,
    pub state: SetbackState,
    /// The attempt that ended it (got back, or was the last).
    pub ended_in: Option<u32>,
    pub seconds: Option<f64>,
    /// Still `behind` in the journal, but the running (or killed) attempt's log
    /// already shows the step: back, at a time only its end would journal.
    pub seen_back: bool,
    /// `not_back`, but the attempt that ended it finished the training: it did
    /// get back, at a time its output never showed (Lightning's bar after a
    /// resume). Its seconds (to the run's end) bound nothing: not counted.
    pub finished: bool,
}

impl Setback {
    /// The seconds counted into the one figure (back, or a lower bound).
    pub fn counted(&self) -> f64 {
        match self.state {
            SetbackState::Back => self.seconds.unwrap_or(0.0),
            SetbackState::NotBack if !self.finished => self.seconds.unwrap_or(0.0),
            _ => 0.0,
        }
    }
}

/// The one figure of time lost to OOMs: "0.8 s from each OOM back to the step it
/// died at (restart and redone steps)", "at least …" with what was not seen
/// said, "unknown …" without a number. `None` without an OOM that was relaunched.
/// `going`: the run still runs (an open stretch is "not back yet", not "had not").
pub fn time_lost_text(setbacks: &[Setback], going: bool) -> Option<String> {
    if setbacks.is_empty() {
        return None;
    }
    let total: f64 = setbacks
        .iter()
        .map(|s| match s.state {
            SetbackState::Behind if s.seen_back => 0.0,
            SetbackState::Behind => s.seconds.unwrap_or(0.0),
            _ => s.counted(),
        })
        .sum();
    let measured = setbacks.iter().any(|s| {
        s.state == SetbackState::Back
            || (s.state == SetbackState::NotBack && !s.finished)
            || (s.state == SetbackState::Behind && s.seconds.is_some() && !s.seen_back)
    });
    let exact = setbacks.iter().all(|s| s.state == SetbackState::Back);
    let each = if setbacks.iter().map(|s| s.ooms.len()).sum::<usize>() == 1 {
        "the OOM back to the step it died at"
    } else {
        "each OOM back to the step it died at"
    };
    let mut out = if !measured {
        format!("the time from {each} is unknown")
    } else {
        format!(
            "{}{} from {each} (restart and redone steps)",
            if exact { "" } else { "at least " },
            duration(total)
        )
    };
    let who = |ooms: &[u32]| {
        let n: Vec<String> = ooms.iter().map(u32::to_string).collect();
        format!(
            "attempt{} {}",
            if ooms.len() == 1 { "" } else { "s" },
            n.join(", ")
        )
    };
    let mut unknown: Vec<u32> = Vec::new();
    for s in setbacks {
        match s.state {
            SetbackState::Back => {}
            SetbackState::Unknown => unknown.extend(&s.ooms),
            SetbackState::Behind if s.seen_back => {
                out += &format!(
                    "; {} is back at step {}, at a time {}",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                    if going {
                        "journaled when it ends"
                    } else {
                        "not journaled (oomguard was killed first)"
                    }
                )
            }
            SetbackState::Behind if going => {
                out += &format!(
                    "; {} is not back at step {} yet ({} since the OOM in {})",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                    duration(s.seconds.unwrap_or(0.0)),
                    who(&s.ooms)
                )
            }
            SetbackState::NotBack if s.finished => {
                out += &format!(
                    "; {} finished the training, so it got back to step {}, at a time its output did not show",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                )
            }
            SetbackState::NotBack | SetbackState::Behind => {
                out += &format!(
                    "; {} had not got back to step {} when the run ended ({} after the OOM in {})",
                    s.ended_in
                        .map_or("the relaunch".to_string(), |n| format!("attempt {n}")),
                    s.step.map_or("?".into(), |n| n.to_string()),
                    duration(s.seconds.unwrap_or(0.0)),
                    who(&s.ooms)
                )
            }
        }
    }
    if !unknown.is_empty() {
        out += &format!(
            "; the step {} died at {} not seen exactly, so the time back after {} cannot be told",
            who(&unknown),
            if unknown.len() == 1 { "was" } else { "were" },
            if unknown.len() == 1 { "it" } else { "them" },
        );
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_lost_is_one_figure_said_as_far_as_it_is_known() {
        let s = |ooms: Vec<u32>, step, state, seconds| Setback {
            ooms,
            step,
            since: std::time::SystemTime::UNIX_EPOCH,
            state,
            ended_in: Some(3),
            seconds,
            seen_back: false,
            finished: false,
        };
        use SetbackState::*;
        assert_eq!(time_lost_text(&[], false), None);
        assert_eq!(
            time_lost_text(&[s(vec![1], Some(6), Back, Some(2.0))], false).unwrap(),
            "2.0 s from the OOM back to the step it died at (restart and redone steps)"
        );
        assert_eq!(
            time_lost_text(
                &[
                    s(vec![1], Some(6), Back, Some(2.0)),
                    s(vec![2], Some(6), NotBack, Some(1.5))
                ],
                false
            )
            .unwrap(),
            "at least 3.5 s from each OOM back to the step it died at (restart and redone steps); attempt 3 had not got back to step 6 when the run ended (1.5 s after the OOM in attempt 2)"
        );
        let unknown = time_lost_text(&[s(vec![1], None, Unknown, None)], false).unwrap();
        assert_eq!(
            unknown,
            "the time from the OOM back to the step it died at is unknown; the step attempt 1 died at was not seen exactly, so the time back after it cannot be told"
        );
        assert!(!unknown.contains("0.0 s"));
        assert!(
            time_lost_text(&[s(vec![1], Some(6), Behind, Some(4.0))], true)
                .unwrap()
                .ends_with(
                    "attempt 3 is not back at step 6 yet (4.0 s since the OOM in attempt 1)"
                )
        );
        // A relaunch that finished the training without its output showing the
        // step: back, at an unknown time; its seconds (to the end) are no bound.
        let finished = Setback {
            finished: true,
            ..s(vec![1], Some(10), NotBack, Some(12.0))
        };
        assert_eq!(finished.counted(), 0.0);
        assert_eq!(
            time_lost_text(std::slice::from_ref(&finished), false).unwrap(),
            "the time from the OOM back to the step it died at is unknown; attempt 3 finished the training, so it got back to step 10, at a time its output did not show"
        );
    }
}
