#!/usr/bin/env bash
# tools/cluster/cluster.sh — a cluster of N hosts on this one machine, for multi-host tests and
# benchmarks (docs/parallel.md, "Running on several hosts"): each host a network namespace with
# its own hostname (a UTS namespace per command), joined by veth pairs to one bridge, on a /24
# subnet of its own, each host's link optionally rate-limited (tbf, both directions). Ranks on
# one host talk through shared memory, across hosts through TCP, as on a real cluster. Needs
# root and `ip netns`. Everything a cluster makes is named after its id and removed by `down`
# (tests call it from a trap); traffic stays between the cluster's own addresses.
#
#   cluster.sh up ID N [RATE]        make hosts ID's 0..N-1 (RATE: a tc rate, e.g. 160mbit)
#   cluster.sh down ID               remove them (processes, namespaces, links, bridge, state)
#   cluster.sh host ID K             the name of host K (its netns name and hostname)
#   cluster.sh addr ID K             host K's address; `subnet ID`: the cluster's X.Y.Z of X.Y.Z.0/24
#   cluster.sh hosts ID              the number of hosts; `state ID`: the cluster's state folder
#   cluster.sh run ID K CMD...       run CMD on host K
#   cluster.sh mpirun ID PPN ARGS... mpirun on host 0 over every host, PPN ranks per host (TCP
#                                    keepalive of 5 s + 3 × 1 s: mpirun sees a lost host in ~8 s)
#   cluster.sh mpirun-args ID        the mpirun options that reach the hosts (tools/elastic.sh)
#   cluster.sh rate ID K RATE|none   change host K's link rate
#   cluster.sh link ID K up|down     take host K's link down (a cut cable) or up again
#   cluster.sh check                 exit 0 when this machine can make a cluster, else say why
#   cluster.sh sweep                 remove the clusters whose owner process has ended
#
# ID: up to 6 letters or digits, unique per run (e.g. from the test's pid); hosts are named
# lc<ID>n<K>, the bridge lc<ID>b, host K's links lc<ID>v<K> (bridge side) and lc<ID>p<K>.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state_root=${LOOM_CLUSTER_STATE:-/run/loom-cluster}

die() {
  echo "cluster: $*" >&2
  exit 1
}
host_name() { echo "lc${1}n${2}"; }
state_dir() { echo "$state_root/$1"; }
# The state folder of an existing cluster.
existing() {
  [ -f "$state_root/$1/subnet" ] || die "no cluster $1"
  echo "$state_root/$1"
}

check() {
  [ "$(id -u)" -eq 0 ] || { echo "not root (network namespaces need root)"; return 1; }
  command -v ip >/dev/null || { echo "no ip command (iproute2)"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare command (util-linux)"; return 1; }
  local probe="lcchk$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create a network namespace here"
    return 1
  fi
  ip netns del "$probe"
  if ! unshare --uts true 2>/dev/null; then
    echo "cannot create a UTS namespace here"
    return 1
  fi
}

valid_id() { [[ "$1" =~ ^[A-Za-z0-9]{1,6}$ ]] || die "id '$1': 1 to 6 letters or digits"; }

host0=10  # host K has the address X.Y.Z.(10 + K)

# A free 10.X.Y.0/24: from the id's checksum, skipping subnets in use on this machine.
pick_subnet() {
  local sum n
  sum=$(printf '%s' "$1" | cksum | cut -d' ' -f1)
  for ((n = 0; n < 4096; ++n)); do
    local x=$(((sum + n) % 4096))
    local net="10.$((200 + x / 256 % 50)).$((x % 256))"
    if ! ip -o addr show | grep -q " $net\." && ! ip route show | grep -q "^$net\."; then
      echo "$net"
      return
    fi
  done
  die "no free 10.x.y.0/24 subnet"
}

up() {
  local id=$1 n=$2 rate=${3:-}
  valid_id "$id"
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "hosts: 1 to 99, got '$n'"
  local dir
  dir=$(state_dir "$id")
  [ ! -e "$dir" ] || die "cluster $id exists already ($dir)"
  mkdir -p "$dir"
  local net
  net=$(pick_subnet "$id")
  echo "$net" >"$dir/subnet"
  echo "$n" >"$dir/hosts"
  echo "${LOOM_CLUSTER_OWNER:-$PPID}" >"$dir/owner"  # sweep removes it once this pid is gone
  local br="lc${id}b"
  ip link add "$br" type bridge
  ip link set "$br" up
  : >"$dir/hostfile"
  for ((k = 0; k < n; ++k)); do
    local h
    h=$(host_name "$id" "$k")
    ip netns add "$h"
    ip link add "lc${id}v${k}" type veth peer name "lc${id}p${k}"
    ip link set "lc${id}v${k}" master "$br"
    ip link set "lc${id}v${k}" up
    ip link set "lc${id}p${k}" netns "$h"
    ip netns exec "$h" ip link set lo up
    ip netns exec "$h" ip addr add "$net.$((k + host0))/24" dev "lc${id}p${k}"
    ip netns exec "$h" ip link set "lc${id}p${k}" up
    echo "$h" >>"$dir/hostfile"
    if [ -n "$rate" ]; then set_rate "$id" "$k" "$rate"; fi
  done
}

down() {
  local id=$1
  valid_id "$id"
  local dir
  dir=$(state_dir "$id")
  local n=0
  [ -f "$dir/hosts" ] && n=$(cat "$dir/hosts")
  for h in $(ip netns list | awk '{print $1}' | grep -E "^lc${id}n[0-9]+$" || true); do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$h" 2>/dev/null || true
  done
  for ((k = 0; k < n; ++k)); do ip link del "lc${id}v${k}" 2>/dev/null || true; done
  ip link del "lc${id}b" 2>/dev/null || true
  rm -rf "$dir"
}

# Host K's link at RATE both ways: egress of the bridge-side end (into the host) and of the
# host-side end (out of it). tbf: burst of 1/50 s at the rate (at least 32 KiB), queue 200 ms.
set_rate() {
  local id=$1 k=$2 rate=$3 h
  h=$(host_name "$id" "$k")
  tc qdisc del dev "lc${id}v${k}" root 2>/dev/null || true
  ip netns exec "$h" tc qdisc del dev "lc${id}p${k}" root 2>/dev/null || true
  [ "$rate" = none ] && return
  tc qdisc add dev "lc${id}v${k}" root tbf rate "$rate" burst 64kb latency 200ms
  ip netns exec "$h" tc qdisc add dev "lc${id}p${k}" root tbf rate "$rate" burst 64kb latency 200ms
}

sweep() {
  [ -d "$state_root" ] || return 0
  for dir in "$state_root"/*; do
    [ -f "$dir/owner" ] || continue
    if ! kill -0 "$(cat "$dir/owner")" 2>/dev/null; then down "$(basename "$dir")"; fi
  done
}

run() {
  local id=$1 k=$2
  shift 2
  local h
  h=$(host_name "$id" "$k")
  exec ip netns exec "$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

# The mpirun options that reach the cluster's hosts (one line: for tools/elastic.sh). UCX (ODC's
# osc/ucx) tells hosts apart by the machine's boot id, not the hostname, so across these
# namespaces it would move one-sided data through shared memory, past the links and their rate
# limits: UCX_TLS=tcp,self keeps it on the network (inside a host that is the loopback).
# Open MPI's TCP sockets are limited to 256 KiB each way: the kernel's autotuned buffers (up to
# 4 MiB) queued ~300 ms of one rank's data ahead of MPI's own control messages on the same
# connection, and an exchange between two hosts after a barrier ran either both ways at once or
# one way at a time, flipping from call to call (8 MB all-gathers at 100 Mbit/s: 24 or 12-15
# MB/s; with 256 KiB, 22–24 in 29 of 30 such calls). The link's bandwidth-delay product is a
# few KiB.

mpirun_args() {
  local dir net
  dir=$(existing "$1")
  net=$(cat "$dir/subnet")
  echo "--bind-to none --oversubscribe --mca plm_rsh_agent $here/rsh_agent.sh" \
    "--mca btl self,vader,tcp --mca btl_tcp_if_include $net.0/24" \
    "--mca oob_tcp_if_include $net.0/24 --mca mpi_yield_when_idle 1" \
    "--mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 1" \
    "--mca oob_tcp_keepalive_probes 3 -x UCX_TLS=tcp,self" \
    "--mca btl_tcp_sndbuf 262144 --mca btl_tcp_rcvbuf 262144"
}

mpirun_on() {
  local id=$1 ppn=$2
  shift 2
  local dir
  dir=$(existing "$id")
  local n flags=() args
  n=$(cat "$dir/hosts")
  sed "s/\$/ slots=$ppn/" "$dir/hostfile" >"$dir/hostfile.slots"
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  read -r -a args <<<"$(mpirun_args "$id")"
  run "$id" 0 mpirun "${flags[@]}" -np $((n * ppn)) --hostfile "$dir/hostfile.slots" \
    --map-by slot "${args[@]}" "$@"
}

cmd=${1:-}
shift || true
case "$cmd" in
  check) check ;;
  up) up "$@" ;;
  down) down "$@" ;;
  sweep) sweep ;;
  host) host_name "$@" ;;
  addr) echo "$(cat "$(existing "$1")/subnet").$(($2 + host0))" ;;
  subnet) cat "$(existing "$1")/subnet" ;;
  hosts) cat "$(existing "$1")/hosts" ;;
  state) existing "$1" ;;
  run) run "$@" ;;
  mpirun) mpirun_on "$@" ;;
  mpirun-args) mpirun_args "$@" ;;
  rate) set_rate "$@" ;;
  link)
    id=$1 k=$2 how=$3
    ip link set "lc${id}v${k}" "$how"
    ;;
  *) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
