#!/usr/bin/env bash
# tools/check_isa.sh [MARCH] — compiles every target (library, tools, tests, benchmarks; CUDA
# off) for a wide ISA, default x86-64-v4 (AVX-512), warnings as errors, and runs nothing. CI
# (.ci/run) calls it after the tests so that a warning which only a wide ISA brings out (a
# compiler's or library's AVX-512 code, Note [Third-party headers and -Werror] in
# CMakeLists.txt) fails CI even on a machine without that ISA. The objects are never run, so
# the machine need not have the ISA.
set -euo pipefail
cd "$(dirname "$0")/.."
march=${1:-x86-64-v4}
build=${LOOM_ISA_BUILD_DIR:-build-isa-$march}
./tools/install_deps.sh
./tools/configure.sh "$build" -DLOOM_WERROR=ON -DLOOM_CUDA=OFF -DLOOM_ARCH="$march"
echo "check_isa: compiling every target for -march=$march in $build (nothing is run)"
cmake --build "$build" -j "$(nproc)"
echo "check_isa: every target compiles for -march=$march with warnings as errors"
