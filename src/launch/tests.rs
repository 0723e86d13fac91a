//! Unit tests of `launch`, with real child processes.
