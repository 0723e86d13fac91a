//! The listeners of the run's [`events`](crate::events): the terminal (the
//! only writer of `oomguard:` lines), the journal (`journal.jsonl`), and the
//! story (the fold that tells the end summary and `oomguard status`).

pub mod journal;
pub mod story;
pub mod terminal;
