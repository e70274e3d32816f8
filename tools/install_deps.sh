#!/usr/bin/env bash
# tools/install_deps.sh — installs the Debian 12 packages Loom builds and tests with. Idempotent:
# packages already present are skipped, and apt is not touched when nothing is missing.
# Run as root (or with sudo available). The CUDA toolkit is not installed here: when
# /usr/local/cuda exists the build uses it (and cuDNN's frontend headers are fetched, below),
# otherwise Loom builds CPU-only. apt's and pip's output go to logs/install_deps.log
# ($LOOM_LOG_DIR), printed in full only when the install fails.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip
  libopenblas-openmp-dev libeigen3-dev libyaml-cpp-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev  # parallel/diloco: the collectives between islands, over TCP
  libpcre2-dev libutf8proc-dev  # data/hf_tokenizer.cpp: regex pre-tokenizers, normalizers
  libgtest-dev googletest libbenchmark-dev nlohmann-json3-dev
  clang-format-14  # tools/check_format.sh (CI checks formatting with this version)
  strace  # tools/check_isa.sh checks that its build runs nothing it built
  iproute2 procps bc  # tools/cluster and tests/multihost (ip netns, tc, pgrep, timings)
  slurmctld slurmd slurm-client  # tools/cluster/slurm.sh: Slurm across the test bed's hosts
  fortunes  # the default training corpus (English text under /usr/share/games/fortunes)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The package manager's output (hundreds of lines) goes to $log; it is printed in full only
# when the install fails.
log_dir=${LOOM_LOG_DIR:-logs}
mkdir -p "$log_dir"
log="$log_dir/install_deps.log"
: >"$log"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  echo "install_deps: installing ${#missing[@]} packages (${missing[*]}); apt's output in $log"
  start=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  if ! { $SUDO apt-get update &&
         $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; } >>"$log" 2>&1; then
    cat "$log"
    echo "install_deps: apt-get failed (its output is above and in $log)" >&2
    exit 1
  fi
  echo "install_deps: installed in $((SECONDS - start)) s"
fi

# cuDNN's C++ frontend, header-only (MIT), for the cuDNN attention path of CUDA builds (Note
# [cuDNN attention] in kernels/attention.h). NVIDIA publishes it on PyPI as a wheel whose
# include/ folder holds the headers: downloaded once, unpacked with its licence under
# $frontend, where CMake looks. Without it (no CUDA toolkit, no network) Loom builds without
# that path and says so.
frontend=/usr/local/share/loom/cudnn_frontend
frontend_version=1.32.0
if [ -x /usr/local/cuda/bin/nvcc ] && [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
  wheels=$(mktemp -d)
  if python3 -m pip download --no-deps --only-binary=:all: -d "$wheels" \
       "nvidia-cudnn-frontend==$frontend_version" >>"$log" 2>&1; then
    $SUDO python3 - "$wheels" "$frontend" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(wheels, "*.whl"))[0])
for name in wheel.namelist():
    if name.startswith("include/") or "/licenses/" in name:
        target = name if name.startswith("include/") else "licenses/" + os.path.basename(name)
        path = os.path.join(dest, target)
        if name.endswith("/"):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(wheel.read(name))
PY
    echo "install_deps: cuDNN frontend $frontend_version headers in $frontend"
  else
    echo "install_deps: could not download nvidia-cudnn-frontend (pip's output in $log);" \
      "the cuDNN attention path will not be built"
  fi
  rm -rf "$wheels"
fi
