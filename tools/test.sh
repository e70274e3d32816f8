#!/usr/bin/env bash
# tools/test.sh — the README's test command: install dependencies, configure (CUDA on when
# nvcc is present, so CUDA code is compiled even without a GPU; warnings are errors), build,
# and run the whole suite with ctest. GPU tests skip themselves when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."

./tools/install_deps.sh

build=${LOOM_BUILD_DIR:-build}
cuda_args=(-DLOOM_CUDA=OFF)
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -n "$nvcc" ]; then
  cuda_args=(-DLOOM_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
fi

jobs=$(nproc)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON "${cuda_args[@]}"
cmake --build "$build" -j "$jobs"
python3 -c "import tensorboard" 2>/dev/null || python3 -m pip install --quiet tensorboard || echo "test.sh: tensorboard not installed; its test will skip"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
