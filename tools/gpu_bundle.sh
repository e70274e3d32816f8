#!/usr/bin/env bash
# tools/gpu_bundle.sh — builds the CUDA programs for a GPU machine HERE and packs them, with the
# non-CUDA shared libraries they need, into .gpu/bundle.tar.xz (ignored by git). A GPU machine
# whose image lacks Loom's build dependencies (yaml-cpp, OpenBLAS, Google Test/Benchmark) runs
# tools/gpu_check.sh on the bundle instead of building; one that has them can build there.
# The CUDA libraries themselves (cudart, cuBLAS/cuBLASLt, NCCL, cuDNN) are the GPU machine's
# (its toolkit or PyTorch's CUDA 13 wheels: tools/gpu_check.sh finds them). Host code is built
# for the baseline x86-64 ISA (LOOM_ARCH empty), not this machine's. bundle/REVISION names the
# commit (and "-dirty" for uncommitted changes); gpu_check.sh prints it.
#
#   tools/gpu_bundle.sh [BUILD_DIR]     (default build-gpu; sm_90, no MPI, Release, -Werror)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
  -DLOOM_CUDA_ARCHITECTURES=90 -DLOOM_MPI=OFF -DLOOM_WERROR=ON -DLOOM_ARCH= >/dev/null
ninja -C "$build" -j"$(nproc)" cuda_tests conformance_tests gpu_kernels_bench train dump_logits convert prepare_data
stage=$(mktemp -d)
mkdir -p "$stage/bundle/bin" "$stage/bundle/lib"
cp "$build"/bin/{cuda_tests,conformance_tests,gpu_kernels_bench,train,dump_logits,convert,prepare_data} "$stage/bundle/bin/"
cp "$build"/lib/libloom.so "$stage/bundle/lib/"
echo "$(git describe --always --dirty) built $(date -u +%Y-%m-%dT%H:%MZ)" >"$stage/bundle/REVISION"
# Every non-system, non-CUDA library the programs load, resolved here.
for lib in $(ldd "$build"/bin/* "$build"/lib/libloom.so 2>/dev/null | awk '/=> \//{print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcudart*|libcublas*|libnccl*|libcudnn*|libloom.so) ;;
    *) cp -L "$lib" "$stage/bundle/lib/" ;;
  esac
done
mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz bundle
rm -rf "$stage"
echo "gpu_bundle: .gpu/bundle.tar.xz ($(du -h .gpu/bundle.tar.xz | cut -f1)): $(tar -tJf .gpu/bundle.tar.xz | tr '\n' ' ')"
