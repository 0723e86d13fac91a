//! The listeners of the run's [`events`](crate::events): the terminal (the
//! only writer of `oomguard:` lines), the journal (`journal.jsonl`), and the
//! story (the fold that tells `oomguard status` and, through `summary`, the
//! end summary).

pub mod journal;
pub mod story;
pub mod summary;
pub mod terminal;
