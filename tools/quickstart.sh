#!/usr/bin/env bash
# tools/quickstart.sh — README command 1: install dependencies, build, prepare the default
# corpus (the `fortunes` package's English text, tokenized with GPT-2 BPE into
# datasets/fortunes/), and train configs/gpt2-tiny.yaml on the CPU (about two minutes on two
# cores), printing the falling loss and a text sample. Extra arguments go to `train`. The
# package manager's and CMake's lines go to logs/ (printed only when they fail), so the first
# screen shows the build's progress and then training.
set -euo pipefail
cd "$(dirname "$0")/.."

./tools/install_deps.sh
./tools/configure.sh build-quickstart -DLOOM_CUDA=OFF -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF
echo "quickstart: building train and prepare_data"
cmake --build build-quickstart -j "$(nproc)" --target train prepare_data

if ! ls datasets/fortunes/train_*.bin >/dev/null 2>&1; then
  build-quickstart/bin/prepare_data --input /usr/share/games/fortunes --format fortunes \
    --out-dir datasets/fortunes
fi
exec build-quickstart/bin/train --config configs/gpt2-tiny.yaml "$@"
