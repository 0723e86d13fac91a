#!/usr/bin/env bash
# The one test command: sets up the Python venv for the real-client tier (cached),
# then runs every Rust test with it, including the real-client tests in
# tests/real_clients.rs, tests/real_trainers.rs (Lightning, nanoGPT, TRL), tests/real_lightning.rs
# and tests/real_llamafactory.rs (LLaMA-Factory, in a second venv of its own), which are
# #[ignore]d so that plain `cargo test` (no venv)
# reports them as ignored instead of passing them unrun.
#
#   tests/run.sh                  # venvs (first time ~3 + ~7 minutes, ~12 GB), then
#                                 #   cargo test --all-targets -- --include-ignored
#   tests/run.sh -- --nocapture   # arguments before `--` go to cargo test, those after it to
#                                 #   the test binaries: cargo test --all-targets -- --include-ignored --nocapture
#   tests/run.sh --setup-only     # only make sure the venvs exist; print the first one's python
#
# tests/slurm.rs's tests are #[ignore]d too: they need the Slurm test cluster that this
# script starts (tests/slurm/start.sh; root, Debian's Slurm packages).
# The two other #[ignore]d tests are measurements, not checks (detect::tests::throughput,
# ~100 s and 1 GiB in a debug build; gpu::tests::measure_sampling_cost): they are skipped
# here and run by name (see their doc comments).
# Environment: OOMGUARD_VENV=DIR overrides the venv location (default
# $HOME/.cache/oomguard/venv-<hash of requirements + python version>), OOMGUARD_VENV_LLAMAFACTORY=DIR
# LLaMA-Factory's (default $HOME/.cache/oomguard/venv-llamafactory-<hash>);
# PYTHON=python3.X picks the interpreter the venv is made from.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
req="tests/real/requirements.txt"
python="${PYTHON:-python3}"

say() { printf '[tests/run.sh] %s\n' "$*" >&2; }

setup_only=0
if [[ "${1:-}" == "--setup-only" ]]; then setup_only=1; shift; fi

command -v "$python" >/dev/null || { say "error: $python not found"; exit 1; }
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
req_nobuild="tests/real/requirements-nobuild.txt"
req_nodeps="tests/real/requirements-nodeps.txt"
# Makes the venv $1 with the function $3, unless the venv's marker already holds its
# key $2 (the hash of what goes in it): then it is reused. A venv whose marker is
# missing or stale (an install that died, other requirements) is made again. One
# installer at a time per venv: two test runs started together must not both install.
cached_venv() {
    local venv="$1" key="$2" install="$3"
    local marker="$venv/.oomguard-install-complete"
    mkdir -p "$(dirname "$venv")"
    exec 9>"$venv.lock"
    if command -v flock >/dev/null && ! flock -n 9; then
        say "another run is installing into $venv: waiting"
        flock 9
    fi
    if [[ -f "$marker" && "$(cat "$marker")" == "$key" ]]; then
        say "reusing venv $venv"
    else
        if [[ -e "$venv" ]]; then
            say "venv $venv is incomplete or stale: removing it"
            rm -rf "$venv"
        fi
        local start=$SECONDS
        "$install" "$venv"
        echo "$key" >"$marker"
        say "venv ready in $((SECONDS - start))s"
    fi
    exec 9>&-
}

install_real() {
    local venv="$1"
    say "creating venv $venv with $python ($pyver)"
    "$python" -m venv "$venv"
    say "installing $req (torch from PyPI is ~3 GB: first time takes a few minutes)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
    say "installing $req_nobuild (DeepSpeed's Python package, no compiled ops)"
    DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --disable-pip-version-check -q \
        --no-build-isolation -r "$req_nobuild"
    say "installing $req_nodeps (package files only)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r "$req_nodeps"
    "$venv/bin/python" -c 'import torch, transformers, accelerate, deepspeed, hydra; print("torch", torch.__version__, "transformers", transformers.__version__, "deepspeed", deepspeed.__version__)' >&2
}

# LLaMA-Factory's venv (tests/real_llamafactory.rs runs `llamafactory-cli train`): a second
# one, because no llamafactory release on PyPI fits the pins above (see the file's comment).
# First time about 7 minutes and 6 GB (its own torch).
install_llamafactory() {
    local venv="$1"
    say "creating venv $venv (LLaMA-Factory) with $python ($pyver)"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req_lf"
    "$venv/bin/llamafactory-cli" version >&2
}

key="$( { cat "$req" "$req_nobuild" "$req_nodeps"; echo "python $pyver"; } | sha256sum | cut -c1-16)"
venv="${OOMGUARD_VENV:-$HOME/.cache/oomguard/venv-$key}"
cached_venv "$venv" "$key" install_real

req_lf="tests/real/requirements-llamafactory.txt"
key_lf="$( { cat "$req_lf"; echo "python $pyver"; } | sha256sum | cut -c1-16)"
venv_lf="${OOMGUARD_VENV_LLAMAFACTORY:-$HOME/.cache/oomguard/venv-llamafactory-$key_lf}"
cached_venv "$venv_lf" "$key_lf" install_llamafactory

export OOMGUARD_REAL_PYTHON="$venv/bin/python"
export OOMGUARD_REAL_LLAMAFACTORY="$venv_lf/bin/llamafactory-cli"
if [[ $setup_only == 1 ]]; then
    say "OOMGUARD_REAL_LLAMAFACTORY=$OOMGUARD_REAL_LLAMAFACTORY"
    echo "$OOMGUARD_REAL_PYTHON"
    exit 0
fi
say "OOMGUARD_REAL_PYTHON=$OOMGUARD_REAL_PYTHON"
say "OOMGUARD_REAL_LLAMAFACTORY=$OOMGUARD_REAL_LLAMAFACTORY"

# Split the arguments at the first `--`: cargo's before it, the test binaries' after it.
cargo_args=()
test_args=()
seen_dashes=0
for a in "$@"; do
    if [[ $seen_dashes == 0 && $a == "--" ]]; then
        seen_dashes=1
    elif [[ $seen_dashes == 0 ]]; then
        cargo_args+=("$a")
    else
        test_args+=("$a")
    fi
done
measurements=(--skip detect::tests::throughput --skip gpu::tests::measure_sampling_cost)

# The Slurm tier (tests/slurm.rs): a one-host cluster with two node entries, started
# in seconds by tests/slurm/start.sh (root; with CI=true it apt-get installs Debian's
# slurmctld slurmd munge slurm-client when missing). In CI a cluster that does not
# start is an error; elsewhere its tests are skipped with a word.
if bash tests/slurm/start.sh >/dev/null; then
    say "Slurm test cluster up (n1, n2)"
elif [[ "${CI:-}" == true ]]; then
    say "error: the Slurm test cluster did not start (tests/slurm/start.sh)"
    exit 1
else
    say "warning: no Slurm test cluster (run tests/slurm/start.sh as root): skipping tests/slurm.rs"
    measurements+=(--skip slurm_)
fi
cmd=(cargo test --all-targets ${cargo_args[@]+"${cargo_args[@]}"}
    -- --include-ignored "${measurements[@]}" ${test_args[@]+"${test_args[@]}"})
say "running: ${cmd[*]}"
exec "${cmd[@]}"
