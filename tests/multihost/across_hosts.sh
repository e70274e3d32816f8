#!/usr/bin/env bash
# tests/multihost/across_hosts.sh HOSTS PPN PROGRAM [ARGS...] — runs an MPI program across a
# cluster of HOSTS hosts made for this run on this machine (tools/cluster/cluster.sh: network
# namespaces on a bridge, each with its own hostname), PPN ranks per host: shared memory inside
# a host, TCP between hosts. The ctest entries multihost.* (label multihost) use it; it exits
# 77, which they count as skipped, saying why, where no cluster can be made (not root, no
# network namespaces). The cluster is removed on exit, and clusters left by killed runs first.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
hosts=$1 ppn=$2
shift 2
cluster="$(cd "$(dirname "$0")/../../tools/cluster" && pwd)/cluster.sh"
if ! why=$("$cluster" check 2>&1); then
  echo "multihost: skipped: $why"
  exit 77
fi
"$cluster" sweep
id=$(printf '%x' $$)
trap '"$cluster" down "$id"' EXIT
trap 'exit 143' TERM INT
LOOM_CLUSTER_OWNER=$$ "$cluster" up "$id" "$hosts"
echo "multihost: $hosts hosts × $ppn ranks ($("$cluster" host "$id" 0) …): $(basename "$1")"
"$cluster" mpirun "$id" "$ppn" -x OMP_NUM_THREADS=1 "$@"
