#!/usr/bin/env bash
# tools/cluster/rsh_agent.sh HOST COMMAND... — Open MPI's plm_rsh_agent for tools/cluster: runs
# the remote command line (as ssh would, through sh) on HOST, a network namespace of the
# cluster, under its own hostname (a UTS namespace), so that each host's Open MPI session
# directory and shared-memory segments are its own.
set -euo pipefail
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
