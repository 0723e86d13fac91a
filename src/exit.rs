//! Exit codes: named, documented constants (docs/reference.md's table mirrors this).

/// The run finished (or `plan` / `diagnose` succeeded).
pub const SUCCESS: i32 = 0;
/// Usage error: bad flags, a malformed policy, a knob that cannot be found.
pub const USAGE: i32 = 2;
/// The policy ran out of steps (or attempts) and the run still does not fit.
pub const EXHAUSTED: i32 = 75;
/// oomguard could not write what the next attempt needs (a config copy, a
/// file edited in place: disk full, a file changed under it) or its restore
/// record. sysexits' EX_IOERR.
pub const CANNOT_WRITE: i32 = 74;
/// `oomguard gpus`: no GPU information (no NVIDIA driver, NVML failed). sysexits' EX_UNAVAILABLE.
pub const NO_GPU_INFO: i32 = 69;
/// The command was found but cannot be executed (permission, not a program).
pub const CANNOT_EXECUTE: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;
/// Base for death by signal N: 128 + N (SIGINT → 130, SIGTERM → 143).
pub const SIGNAL_BASE: i32 = 128;
