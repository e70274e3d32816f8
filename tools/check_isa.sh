#!/usr/bin/env bash
# tools/check_isa.sh [MARCH] — compiles every target (library, tools, tests, benchmarks; CUDA
# off) for a wide ISA, default x86-64-v4 (AVX-512), warnings as errors, and runs nothing it
# built. CI (.ci/run) calls it after the tests so that a warning which only a wide ISA brings out
# (a compiler's or library's AVX-512 code, Note [Third-party headers and -Werror] in
# CMakeLists.txt) fails CI on any machine, with or without that ISA.
#
# Nothing built is executed: for a LOOM_ARCH other than native, gtest's test discovery waits
# until ctest runs (Note [Test discovery and the ISA] in tests/CMakeLists.txt). The build runs
# under strace (execve only), and any program started from inside the build folder fails the
# check, naming it — so the promise is checked on every run, not assumed.
set -euo pipefail
cd "$(dirname "$0")/.."
march=${1:-x86-64-v4}
build=${LOOM_ISA_BUILD_DIR:-build-isa-$march}
log_dir=${LOOM_LOG_DIR:-logs}
./tools/install_deps.sh
./tools/configure.sh "$build" -DLOOM_WERROR=ON -DLOOM_CUDA=OFF -DLOOM_ARCH="$march"
echo "check_isa: compiling every target for -march=$march in $build (nothing it builds is run)"
mkdir -p "$log_dir"
trace="$log_dir/check_isa-execve.log"
if ! strace -f -qq -e trace=execve -o /dev/null true 2>/dev/null; then
  # No ptrace here (a container without the capability): build, and say the audit did not run.
  cmake --build "$build" -j "$(nproc)"
  echo "check_isa: every target compiles for -march=$march with warnings as errors" \
    "(strace cannot trace here, so the no-execution audit was not run)"
  exit 0
fi
strace -f -qq --seccomp-bpf -e trace=execve -o "$trace" cmake --build "$build" -j "$(nproc)"
build_abs=$(cd "$build" && pwd -P)
ran=$(grep -oE "execve\(\"$build_abs/[^\"]*\"" "$trace" | sed 's/^execve("//; s/"$//' | sort -u || true)
if [ -n "$ran" ]; then
  echo "check_isa: the build executed programs it built (full trace in $trace):" >&2
  echo "$ran" | sed 's/^/  /' >&2
  exit 1
fi
echo "check_isa: every target compiles for -march=$march with warnings as errors;" \
  "no program from $build was executed (execve trace: $trace)"
