#!/usr/bin/env bash
# tools/quickstart.sh — README command 1: set up and train the tiny default model on the CPU.
# The trainer (`train --config configs/gpt2-tiny.yaml`) arrives with the training issue; until
# then this installs the dependencies and builds the library, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
echo "quickstart: Loom's core is built; the trainer is not part of this version yet."
