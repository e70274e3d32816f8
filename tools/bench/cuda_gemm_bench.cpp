// tools/bench/cuda_gemm_bench.cpp — GPU throughput of the cuBLASLt GEMM kernels and the fused
// cross-entropy (kernels/cuda/matmul.cu, kernels/cuda/cross_entropy.cu): a large bf16 GEMM
// (the device's GEMM ceiling for MFU), GPT-2 124M's Linear shapes at B·T = 8192 (plain and with
// the bias / bias+GELU epilogues), f32 exact against TF32, and cross-entropy forward/backward
// over the padded GPT-2 vocabulary (bytes moved per second: compare with the copy bandwidth).
// A measurement, never a test; without a GPU it says so and exits 0.
//
//   build/bin/cuda_gemm_bench [--benchmark_filter=...]
//
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "core/rng.h"
#include "kernels/copy.h"
#include "kernels/cross_entropy.h"
#include "kernels/matmul.h"
#include "kernels/registry.h"

namespace loom {
namespace {

constexpr int kReps = 10;  // launches per timed iteration (one host sync each iteration)

// Waits for the compute stream: a blocking device→host copy of one element orders after it.
void sync(const Tensor& t) { (void)t.reshape({-1}).narrow(0, 0, 1).to(Device::cpu()); }

Tensor random_cuda(const Shape& shape, DType dt, Generator& gen) {
  return randn(shape, gen, dt, 0.0, 1.0).to(Device::cuda());
}

enum class Kind { kPlain, kBias, kBiasGelu };

// x (M, K) · wᵀ with w (N, K), as Linear's forward.
void bm_linear(benchmark::State& st, int64_t m, int64_t n, int64_t k, DType dt, Kind kind,
               bool tf32) {
  Generator gen(1);
  const Tensor x = random_cuda({m, k}, dt, gen), w = random_cuda({n, k}, dt, gen);
  const Tensor bias = random_cuda({n}, dt, gen);
  Tensor y = Tensor::empty({m, n}, dt, Device::cuda());
  Tensor pre = Tensor::empty({m, n}, dt, Device::cuda());
  kernels::AllowTf32Guard guard(tf32);
  auto once = [&] {
    if (kind == Kind::kPlain) kernels::call_kernel<kernels::gemm_k>(x, w, y, false, true, 1.0, 0.0);
    if (kind == Kind::kBias) kernels::call_kernel<kernels::gemm_bias_k>(x, w, bias, y, false, true);
    if (kind == Kind::kBiasGelu) {
      kernels::call_kernel<kernels::gemm_bias_gelu_k>(x, w, bias, pre, y, false, true);
    }
  };
  once();  // plan and workspace creation happen here, not in the timed loop
  sync(y);
  for (auto _ : st) {
    for (int r = 0; r < kReps; ++r) once();
    sync(y);
  }
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  st.counters["TFLOP/s"] =
      benchmark::Counter(flops * kReps * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_cross_entropy(benchmark::State& st, DType dt, bool backward) {
  const int64_t rows = 4096, vp = 50304, vocab = 50257;
  Generator gen(2);
  const Tensor logits = random_cuda({rows, vp}, dt, gen);
  const Tensor targets = randint({rows}, 0, vocab, gen).to(Device::cuda());
  const DType row = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor loss = Tensor::empty({rows}, row, Device::cuda());
  Tensor lse = Tensor::empty({rows}, row, Device::cuda());
  Tensor dlogits = Tensor::zeros({rows, vp}, dt, Device::cuda());
  const Tensor dloss = Tensor::scalar(1.0, row, Device::cuda());
  kernels::call_kernel<kernels::cross_entropy_forward_k>(logits, targets, -100, vocab, loss, lse);
  auto once = [&] {
    if (backward) {
      kernels::call_kernel<kernels::cross_entropy_backward_k>(logits, targets, lse, dloss,
                                                              1.0 / rows, -100, vocab, dlogits);
    } else {
      kernels::call_kernel<kernels::cross_entropy_forward_k>(logits, targets, -100, vocab, loss,
                                                             lse);
    }
  };
  once();
  sync(lse);
  for (auto _ : st) {
    for (int r = 0; r < kReps; ++r) once();
    sync(lse);
  }
  // Forward reads the logits once; backward reads them and reads + writes dlogits.
  const double bytes = static_cast<double>(rows * vocab) * static_cast<double>(dtype_size(dt)) *
                       (backward ? 3.0 : 1.0);
  st.counters["GB/s"] =
      benchmark::Counter(bytes * kReps * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->UseRealTime()
        ->MinTime(0.3)
        ->Unit(benchmark::kMillisecond);
  };
  reg("gemm_ceiling/bf16/8192x8192x8192", [](benchmark::State& st) {
    bm_linear(st, 8192, 8192, 8192, DType::kBF16, Kind::kPlain, false);
  });
  struct Shape3 {
    const char* name;
    int64_t n, k;
  };
  for (const Shape3& s : {Shape3{"qkv", 2304, 768}, Shape3{"fc", 3072, 768},
                          Shape3{"proj", 768, 3072}, Shape3{"lm_head", 50304, 768}}) {
    const int64_t n = s.n, k = s.k;
    reg(std::string("linear/bf16/") + s.name, [n, k](benchmark::State& st) {
      bm_linear(st, 8192, n, k, DType::kBF16, Kind::kPlain, false);
    });
    reg(std::string("linear_bias/bf16/") + s.name, [n, k](benchmark::State& st) {
      bm_linear(st, 8192, n, k, DType::kBF16, Kind::kBias, false);
    });
  }
  reg("linear_bias_gelu/bf16/fc", [](benchmark::State& st) {
    bm_linear(st, 8192, 3072, 768, DType::kBF16, Kind::kBiasGelu, false);
  });
  reg("gemm/f32/4096", [](benchmark::State& st) {
    bm_linear(st, 4096, 4096, 4096, DType::kF32, Kind::kPlain, false);
  });
  reg("gemm/tf32/4096", [](benchmark::State& st) {
    bm_linear(st, 4096, 4096, 4096, DType::kF32, Kind::kPlain, true);
  });
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const std::string d = dtype_name(dt);
    reg("cross_entropy_fwd/" + d, [dt](benchmark::State& st) { bm_cross_entropy(st, dt, false); });
    reg("cross_entropy_bwd/" + d, [dt](benchmark::State& st) { bm_cross_entropy(st, dt, true); });
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  using loom::kernels::Registry;
  if (!Registry::instance().has("device_count", loom::DeviceType::kCuda) ||
      loom::kernels::find_kernel<loom::kernels::device_count_k>(loom::DeviceType::kCuda)() <= 0) {
    std::printf("cuda_gemm_bench: no CUDA device (or a build without CUDA); nothing measured\n");
    return 0;
  }
  loom::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
