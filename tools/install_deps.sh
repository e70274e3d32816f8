#!/usr/bin/env bash
# tools/install_deps.sh — installs the Debian 12 packages Loom builds and tests with. Idempotent:
# packages already present are skipped, and apt is not touched when nothing is missing.
# Run as root (or with sudo available). The CUDA toolkit is not installed here: when
# /usr/local/cuda exists the build uses it, otherwise Loom builds CPU-only.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip
  libopenblas-openmp-dev libeigen3-dev libyaml-cpp-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev googletest libbenchmark-dev nlohmann-json3-dev
  fortunes  # the default training corpus (English text under /usr/share/games/fortunes)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
