#!/usr/bin/env bash
# Start a one-host Slurm cluster with two node entries (n1, n2) for the tests in
# tests/slurm.rs: munged, slurmctld and two slurmd, each with its own port and
# %n-named spool, pid and log files. No systemd: the daemons are started
# directly. Idempotent: when the cluster already answers, it only says so.
#
# Needs root and Debian's packages `slurmctld slurmd munge slurm-client`
# (installed with apt-get when CI=true or OOMGUARD_SLURM_INSTALL=1).
# Prints nothing but errors and one last line, "slurm ready", on success.
set -euo pipefail

state=/var/lib/oomguard-slurm
conf=/etc/slurm/slurm.conf
log() { echo "tests/slurm/start.sh: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "needs root (daemons, /etc/slurm)"; exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v munged >/dev/null || ! command -v srun >/dev/null; then
  if [ "${CI:-}" = true ] || [ "${OOMGUARD_SLURM_INSTALL:-}" = 1 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq slurmctld slurmd munge slurm-client >/dev/null
  else
    log "Slurm is not installed: apt-get install -y slurmctld slurmd munge slurm-client (or run with CI=true)"
    exit 1
  fi
fi

if sinfo -h -o '%T' 2>/dev/null | grep -qE 'idle|mix|alloc' && [ -f "$conf" ] && grep -q oomguard-test "$conf"; then
  echo "slurm ready"
  exit 0
fi

host=$(hostname -s)
mkdir -p "$state" /etc/slurm /run/munge /var/log/munge /var/lib/munge
if [ -f "$conf" ] && ! grep -q oomguard-test "$conf"; then
  log "$conf exists and is not this test cluster's: not touching it"; exit 1
fi
cat >"$conf" <<CONF
# oomguard-test: written by tests/slurm/start.sh (a one-host, two-node test cluster)
ClusterName=oomguard
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
SlurmctldPort=6817
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=2
MinJobAge=2
InactiveLimit=0
MessageTimeout=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=4 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
mkdir -p "$state/ctld" "$state/d-n1" "$state/d-n2"

# munged: a key, then the daemon (as root with --force: this is a throwaway test host).
if ! pgrep -x munged >/dev/null; then
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chmod 0400 /etc/munge/munge.key
  munged --force
fi
for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
running "$state/slurmctld.pid" || slurmctld -i
running "$state/slurmd-n1.pid" || slurmd -N n1
running "$state/slurmd-n2.pid" || slurmd -N n2

for _ in $(seq 200); do
  if [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -cE 'idle|mix|alloc')" = 2 ]; then
    echo "slurm ready"
    exit 0
  fi
  sleep 0.1
done
log "the cluster did not come up; sinfo says:"
sinfo -N >&2 || true
tail -n 20 "$state/slurmctld.log" "$state"/slurmd-n*.log >&2 || true
exit 1
