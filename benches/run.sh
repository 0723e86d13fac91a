#!/usr/bin/env bash
# Benchmarks of oomguard against plain-pipe / plain-shell baselines, measured side by side in
# one run and reported as ratios (see benches/bench.py for what each row measures).
#
#   benches/run.sh            # full sizes: 2 GiB pass-through, 1 GiB diagnose, 20 trials
#   benches/run.sh --quick    # small sizes (256 MiB, 128 MiB, 10 trials): a minute or so
#
# Builds target/release/oomguard first. Prints a table (metric, oomguard, baseline, ratio,
# target, pass/fail) and the machine. Asserts nothing: the exit status is 0 whatever the
# figures (tests assert behaviour; this reports performance).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cargo build --release --quiet
exec python3 benches/bench.py --bin "$repo/target/release/oomguard" "$@"
