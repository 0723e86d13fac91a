#!/usr/bin/env bash
# Benchmarks of oomguard against plain-pipe / plain-shell baselines, measured side by side in
# one run and reported as ratios (see benches/bench.py for what each row measures).
#
#   benches/run.sh                       # full sizes: 2 GiB pass-through, 1 GiB diagnose, 20 trials
#   benches/run.sh --quick               # smaller sizes (1 GiB, 512 MiB, 10 trials)
#   benches/run.sh --against e326ba0     # the same bench, this checkout and REV side by side
#   benches/run.sh --against HEAD~1 --quick
#
# Builds target/release/oomguard first. With --against REV it also builds REV (release) in a
# temporary detached git worktree (removed afterwards; its build directory,
# target/against/, is kept so the next comparison rebuilds little) and runs every
# measurement for both binaries back to back, trial by trial, in the same run: the table
# has a column for REV, one for this checkout, their ratio (this / REV), the baseline
# (cat, script, sh) and the target. Asserts nothing: the exit status is 0 whatever the
# figures (tests assert behaviour; this reports performance).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

against=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --against) against="${2:?--against needs a revision}"; shift 2 ;;
        --against=*) against="${1#--against=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done

cargo build --release --quiet
head_label="$(git rev-parse --short HEAD)"
[ -z "$(git status --porcelain --untracked-files=no)" ] || head_label="$head_label+dirty"
bins=(--bin "$head_label=$repo/target/release/oomguard")

if [ -n "$against" ]; then
    sha="$(git rev-parse --verify --quiet "$against^{commit}")" \
        || { echo "run.sh: '$against' is not a commit here" >&2; exit 2; }
    short="$(git rev-parse --short "$sha")"
    # A copy of the old binary per commit: a second comparison against it builds nothing.
    saved="$repo/target/against/bin/$sha/oomguard"
    if [ ! -x "$saved" ]; then
        wt="$(mktemp -d "${TMPDIR:-/tmp}/oomguard-against-XXXXXX")"
        # The worktree is removed whatever happens (its build outputs live elsewhere).
        trap 'git -C "$repo" worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$wt"' EXIT
        git worktree add --quiet --detach "$wt" "$sha"
        echo "run.sh: building $short (release) in $wt" >&2
        (cd "$wt" && CARGO_TARGET_DIR="$repo/target/against/build" cargo build --release --quiet)
        mkdir -p "$(dirname "$saved")"
        cp "$repo/target/against/build/release/oomguard" "$saved"
        # Removed now: the `exec` below replaces this shell, and the EXIT trap with it
        # (worktrees were left behind under $TMPDIR).
        git -C "$repo" worktree remove --force "$wt" >/dev/null 2>&1 || true
        rm -rf "$wt"
        trap - EXIT
    fi
    # The old binary first: the column order is before, after.
    bins=(--bin "$short=$saved" "${bins[@]}")
fi

exec python3 benches/bench.py "${bins[@]}" "${args[@]}"
