#!/usr/bin/env bash
# tools/configure.sh BUILD_DIR [CMAKE_ARGS...] — configures Loom with CMake (Ninja, Release) for
# the scripts (test.sh, quickstart.sh, check_isa.sh). CMake's own lines go to
# logs/configure-<build dir name>.log ($LOOM_LOG_DIR); only Loom's summary lines (backend,
# ISA, libraries found) are printed, and the whole log when configuring fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1
shift
log_dir=${LOOM_LOG_DIR:-logs}
mkdir -p "$log_dir"
log="$log_dir/configure-$(basename "$build").log"
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$log" 2>&1; then
  cat "$log"
  echo "configure: cmake failed for $build (its output is above and in $log)" >&2
  exit 1
fi
grep -E '^-- Loom: ' "$log" | sed 's/^-- /configure: /' || true
