#!/usr/bin/env bash
# tools/cluster/slurm.sh — a Slurm cluster on the hosts of a tools/cluster cluster: slurmctld on
# host 0, one slurmd on every host (each under its own hostname, so each is a node of its own),
# Debian's slurm packages, no munge (auth/none: every daemon runs as root on this one machine).
# Jobs run with `srun --mpi=pmix` as on a real cluster: PMIx wires the ranks up, no mpirun.
# The daemons live in the hosts' network namespaces, so `cluster.sh down ID` ends them with
# everything else; their configuration, state, logs and per-node spool and TmpFS lie in the
# cluster's state folder. docs/parallel.md, "Running on several hosts".
#
#   slurm.sh up ID [CPUS]    start Slurm on cluster ID's hosts (CPUS per node: default nproc)
#                            and wait (30 s at most) until every node is idle
#   slurm.sh run ID CMD...   run CMD (sbatch, srun, sinfo…) on host 0 with SLURM_CONF and the
#                            MPI settings that keep jobs on the cluster's own network
#   slurm.sh check           exit 0 when this machine has the Slurm daemons, else say why
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/cluster.sh"

die() {
  echo "slurm: $*" >&2
  exit 1
}

check() {
  local p
  for p in slurmctld slurmd sbatch srun sinfo; do
    command -v "$p" >/dev/null || { echo "no $p (Debian: slurmctld slurmd slurm-client)"; return 1; }
  done
}

# The folder of cluster ID's Slurm files (cluster.sh made the cluster's state folder).
slurm_dir() {
  local dir
  dir=$("$cluster" state "$1") || exit 1
  echo "$dir/slurm"
}

# Slurm's cgroup plugin must load even where nothing uses cgroups (proctrack/linuxproc and
# task/affinity here): cgroup/v2 where /sys/fs/cgroup is the unified hierarchy (without
# systemd's delegation), else cgroup/v1.
cgroup_conf() {
  if [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then
    printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n'
  else
    printf 'CgroupPlugin=cgroup/v1\n'
  fi
}

# slurm.conf for hosts 0..n-1. TmpFS is per node (%n): the PMIx plugin makes its job folders
# there, and the hosts share this machine's /tmp.
slurm_conf() {
  local id=$1 dir=$2 n=$3 cpus=$4 k
  cat <<EOF
# Written by tools/cluster/slurm.sh for cluster $id.
ClusterName=lc${id,,}
SlurmctldHost=$("$cluster" host "$id" 0)($("$cluster" addr "$id" 0))
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/tmp/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
EOF
  for ((k = 0; k < n; ++k)); do
    echo "NodeName=$("$cluster" host "$id" "$k") NodeAddr=$("$cluster" addr "$id" "$k")" \
      "CPUs=$cpus State=UNKNOWN"
  done
  echo "PartitionName=loom Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

up() {
  local id=$1 cpus=${2:-$(nproc)}
  local why dir n k
  why=$(check) || die "$why"
  dir=$(slurm_dir "$id")
  [ ! -e "$dir" ] || die "Slurm is already up on cluster $id ($dir)"
  n=$("$cluster" hosts "$id")
  mkdir -p "$dir/state"
  for ((k = 0; k < n; ++k)); do
    local h
    h=$("$cluster" host "$id" "$k")
    mkdir -p "$dir/spool/$h" "$dir/tmp/$h"
  done
  slurm_conf "$id" "$dir" "$n" "$cpus" >"$dir/slurm.conf"
  cgroup_conf >"$dir/cgroup.conf"
  "$cluster" run "$id" 0 slurmctld -i -f "$dir/slurm.conf" ||
    die "slurmctld did not start: $(tail -n 5 "$dir/slurmctld.log" 2>/dev/null)"
  for ((k = 0; k < n; ++k)); do
    "$cluster" run "$id" "$k" slurmd -f "$dir/slurm.conf" ||
      die "slurmd did not start on host $k: $(tail -n 5 "$dir"/slurmd.*.log 2>/dev/null)"
  done
  local idle
  for _ in $(seq 1 300); do
    idle=$(SLURM_CONF="$dir/slurm.conf" "$cluster" run "$id" 0 sinfo -h -t idle -o %D 2>/dev/null |
      awk '{s += $1} END {print s + 0}')
    [ "$idle" -eq "$n" ] && return 0
    sleep 0.1
  done
  die "only $idle of $n nodes idle after 30 s (logs in $dir)"
}

# CMD on host 0, as a user on the cluster's login node would run it, with the MPI settings that
# keep the ranks' traffic on the cluster's network (as cluster.sh mpirun-args does for mpirun).
run() {
  local id=$1 dir net
  shift
  dir=$(slurm_dir "$id")
  [ -f "$dir/slurm.conf" ] || die "Slurm is not up on cluster $id"
  net=$("$cluster" subnet "$id")
  SLURM_CONF="$dir/slurm.conf" OMPI_MCA_btl=self,vader,tcp \
    OMPI_MCA_btl_tcp_if_include="$net.0/24" OMPI_MCA_mpi_yield_when_idle=1 UCX_TLS=tcp,self \
    "$cluster" run "$id" 0 "$@"
}

cmd=${1:-}
shift || true
case "$cmd" in
  check) check ;;
  up) up "$@" ;;
  run) run "$@" ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
