// tools/bench/gpu_kernels_bench.cpp — every CUDA kernel's achieved bandwidth or FLOP/s as a
// fraction of the device's own ceilings, measured in the same run: a large device-to-device
// copy (bytes read + bytes written per second) and a large bf16 GEMM through Loom's gemm kernel
// (cuBLASLt). A measurement, never a test: it asserts nothing about speed. Without a CUDA device
// it says so and exits 0 (CI builds it, the GPU machine runs it from tools/gpu_check.sh).
//
//   gpu_kernels_bench [--benchmark_filter=...]
//
// Byte counts are the fewest bytes each kernel must move (each input read once, each output
// written once, accumulated outputs read and written); FLOP counts are the matmul FLOPs (causal
// attention counts the lower triangle only: forward 2 matmuls of 2·T²·D/2 per head, backward
// 2.5× the forward, the usual flash-attention convention). Timing: a few launches to warm up,
// then R launches between two device synchronisations, on the host clock; the median of the
// benchmark's repetitions is reported.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/copy.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"
#include "kernels/rope.h"
#include "kernels/softmax.h"

namespace loom {
namespace {

using kernels::call_kernel;
constexpr DType kBF16 = DType::kBF16;

Device gpu() { return Device::cuda(0); }

// Random device tensor (drawn on the host: never zeros, which can run faster than real data).
Tensor rand_gpu(const Shape& shape, DType dtype, Generator& gen, double stddev = 1.0) {
  return randn(shape, gen, DType::kF32, 0.0, stddev).to(dtype).to(gpu());
}

// Waits for all device work: a blocking device→host copy is ordered after every earlier launch
// (kernels/cuda/copy.cu).
void sync_device(const Tensor& probe) { (void)probe.to(Device::cpu()); }

// Seconds per launch of `f`: 2 warm-up launches, then `reps` launches between two syncs.
double seconds_per_launch(const std::function<void()>& f, const Tensor& probe, int reps) {
  for (int i = 0; i < 2; ++i) f();
  sync_device(probe);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  sync_device(probe);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / reps;
}

// One measured kernel: `bytes` or `flops` per launch (the other 0), the tensors it owns kept
// alive by the closure.
struct Case {
  std::string name;
  double bytes = 0, flops = 0;
  std::function<void()> launch;
};

struct Result {
  std::string name;
  double seconds = 0, rate = 0, fraction = 0;  // rate: B/s or FLOP/s
  bool is_flops = false;
  std::string error;
};

// The device's two ceilings, measured before anything else.
struct Ceilings {
  double copy_bytes_per_s = 0, gemm_flops_per_s = 0;
};

Ceilings measure_ceilings(Generator& gen) {
  Ceilings c;
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  // The probe that waits for the device is one element: a probe of the whole output would add
  // its device-to-host copy to the time (it halved both ceilings on the first GPU run).
  const Tensor probe = Tensor::empty({1}, DType::kF32, gpu());
  Tensor src = rand_gpu({n}, DType::kF32, gen), dst = Tensor::empty({n}, DType::kF32, gpu());
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    best = std::min(best,
                    seconds_per_launch([&] { call_kernel<kernels::copy_k>(src, dst); }, probe, 10));
  }
  c.copy_bytes_per_s = 2.0 * static_cast<double>(n) * 4 / best;
  const int64_t m = 8192;
  Tensor a = rand_gpu({m, m}, kBF16, gen), b = rand_gpu({m, m}, kBF16, gen);
  Tensor out = Tensor::empty({m, m}, kBF16, gpu());
  best = 1e30;
  for (int i = 0; i < 5; ++i) {
    best = std::min(
        best,
        seconds_per_launch([&] { call_kernel<kernels::gemm_k>(a, b, out, false, false, 1.0, 0.0); },
                           probe, 10));
  }
  c.gemm_flops_per_s = 2.0 * static_cast<double>(m) * m * m / best;
  return c;
}

// Runs a launch once to fill saved statistics for a backward case; an error here is reported
// by the timed case itself.
void prime(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception&) {
  }
}

// The kernels at training shapes: GPT-2 1.5B-like widths, 8192 tokens per launch, bf16.
std::vector<Case> make_cases(Generator& gen) {
  std::vector<Case> cases;
  const int64_t N = 8192, C = 1600, Vp = 50304, n = N * 4 * C;
  auto add = [&](std::string name, double bytes, double flops, std::function<void()> f) {
    cases.push_back({std::move(name), bytes, flops, std::move(f)});
  };
  {  // element-wise on the MLP hidden (N, 4C)
    auto x = rand_gpu({n}, kBF16, gen), dy = rand_gpu({n}, kBF16, gen),
         y = Tensor::empty({n}, kBF16, gpu());
    auto dx = rand_gpu({n}, kBF16, gen), u = rand_gpu({n}, kBF16, gen),
         du = rand_gpu({n}, kBF16, gen);
    add("gelu_forward bf16", 4.0 * n, 0,
        [=]() mutable { call_kernel<kernels::gelu_forward_k>(x, y); });
    add("gelu_backward bf16", 8.0 * n, 0,
        [=]() mutable { call_kernel<kernels::gelu_backward_k>(x, dy, dx); });
    add("swiglu_forward bf16", 6.0 * n, 0,
        [=]() mutable { call_kernel<kernels::swiglu_forward_k>(x, u, y); });
    add("swiglu_backward bf16", 14.0 * n, 0,
        [=]() mutable { call_kernel<kernels::swiglu_backward_k>(x, u, dy, dx, du); });
    add("add bf16", 6.0 * n, 0, [=]() mutable {
      call_kernel<kernels::binary_forward_k>(kernels::BinaryOp::kAdd, x, u, y);
    });
    add("axpy bf16", 6.0 * n, 0, [=]() mutable { call_kernel<kernels::axpy_k>(0.5, x, dx); });
    add("dropout_forward bf16", 4.0 * n, 0,
        [=]() mutable { call_kernel<kernels::dropout_forward_k>(x, 0.1, 7, 0, y); });
    auto xf = rand_gpu({n}, DType::kF32, gen), ss = Tensor::empty({}, DType::kF64, gpu());
    add("sum_squares f32", 4.0 * n, 0,
        [=]() mutable { call_kernel<kernels::sum_squares_forward_k>(xf, ss); });
  }
  {  // norms and softmax on (N, C)
    auto x = rand_gpu({N, C}, kBF16, gen), dy = rand_gpu({N, C}, kBF16, gen),
         dx = rand_gpu({N, C}, kBF16, gen);
    auto y = Tensor::empty({N, C}, kBF16, gpu());
    auto w = rand_gpu({C}, kBF16, gen), b = rand_gpu({C}, kBF16, gen);
    auto dw = rand_gpu({C}, kBF16, gen), db = rand_gpu({C}, kBF16, gen);
    // Statistics in norm_stat_dtype(bf16) = f32 (kernels/norm.h).
    const DType sd = kernels::norm_stat_dtype(kBF16);
    auto mean = Tensor::empty({N}, sd, gpu()), rstd = Tensor::empty({N}, sd, gpu());
    const double nc = static_cast<double>(N) * C;
    add("layer_norm_forward bf16", 4.0 * nc, 0, [=]() mutable {
      call_kernel<kernels::layer_norm_forward_k>(x, w, b, 1e-5, y, mean, rstd);
    });
    prime(cases.back().launch);
    add("layer_norm_backward bf16", 8.0 * nc, 0, [=]() mutable {
      call_kernel<kernels::layer_norm_backward_k>(dy, x, w, mean, rstd, dx, dw, db);
    });
    auto rstd2 = Tensor::empty({N}, sd, gpu());
    add("rms_norm_forward bf16", 4.0 * nc, 0,
        [=]() mutable { call_kernel<kernels::rms_norm_forward_k>(x, w, 1e-5, y, rstd2); });
    prime(cases.back().launch);
    add("rms_norm_backward bf16", 8.0 * nc, 0,
        [=]() mutable { call_kernel<kernels::rms_norm_backward_k>(dy, x, w, rstd2, dx, dw); });
    add("softmax_forward bf16", 4.0 * nc, 0,
        [=]() mutable { call_kernel<kernels::softmax_forward_k>(x, y); });
    add("softmax_backward bf16", 8.0 * nc, 0,
        [=]() mutable { call_kernel<kernels::softmax_backward_k>(y, dy, dx); });
  }
  {  // RoPE on (B, T, H, D) = (8, 1024, 32, 64), embedding of N tokens
    const int64_t B = 8, T = 1024, H = 32, D = 64;
    auto x = rand_gpu({B, T, H, D}, kBF16, gen), y = Tensor::empty({B, T, H, D}, kBF16, gpu());
    std::vector<int32_t> p(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) p[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    auto pos = Tensor::from_vector(p, {T}).to(gpu());
    add("rope_forward bf16", 4.0 * B * T * H * D, 0,
        [=, f = kernels::RopeFrequencies::plain(10000.0, D)]() mutable {
          call_kernel<kernels::rope_forward_k>(x, pos, f, y);
        });
    auto ids = randint({N}, 0, Vp, gen, DType::kI32).to(gpu());
    auto table = rand_gpu({Vp, C}, kBF16, gen), out = Tensor::empty({N, C}, kBF16, gpu());
    auto dtable = rand_gpu({Vp, C}, kBF16, gen), dout = rand_gpu({N, C}, kBF16, gen);
    add("embedding_forward bf16", 4.0 * N * C, 0,
        [=]() mutable { call_kernel<kernels::embedding_forward_k>(ids, table, out, true); });
    add("embedding_backward bf16", 6.0 * N * C, 0,
        [=]() mutable { call_kernel<kernels::embedding_backward_k>(ids, dout, dtable, true); });
  }
  {  // cross-entropy over the padded GPT-2 vocabulary
    auto logits = rand_gpu({N, Vp}, kBF16, gen, 2.0), dlogits = rand_gpu({N, Vp}, kBF16, gen);
    auto targets = randint({N}, 0, 50257, gen, DType::kI32).to(gpu());
    auto loss = Tensor::empty({N}, DType::kF32, gpu()),
         lse = Tensor::empty({N}, DType::kF32, gpu());
    auto dloss = Tensor::full({}, 1.0, DType::kF32, gpu());
    const double nv = static_cast<double>(N) * Vp;
    add("cross_entropy_forward bf16", 2.0 * nv, 0, [=]() mutable {
      call_kernel<kernels::cross_entropy_forward_k>(logits, targets, -100, 50257, loss, lse);
    });
    prime(cases.back().launch);  // lse for the backward
    add("cross_entropy_backward bf16", 6.0 * nv, 0, [=]() mutable {
      call_kernel<kernels::cross_entropy_backward_k>(logits, targets, lse, dloss, 1.0 / N, -100,
                                                     50257, dlogits);
    });
  }
  {  // AdamW over 100M f32 parameters
    const int64_t p = 100'000'000;
    auto w = rand_gpu({p}, DType::kF32, gen, 0.02), g = rand_gpu({p}, DType::kF32, gen, 1e-3);
    auto m = rand_gpu({p}, DType::kF32, gen, 1e-3), v = Tensor::full({p}, 1e-6, DType::kF32, gpu());
    add("adamw_step f32", 28.0 * p, 0, [=]() mutable {
      call_kernel<kernels::adamw_step_k>(w, g, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, 10);
    });
  }
  // GEMMs of a GPT-2 1.5B layer (x (N, C) · Wᵀ), forward and both backward forms.
  for (const auto& [k, o, what] : std::vector<std::tuple<int64_t, int64_t, const char*>>{
           {C, 3 * C, "qkv"}, {C, 4 * C, "fc"}, {4 * C, C, "proj"}}) {
    auto x = rand_gpu({N, k}, kBF16, gen), w = rand_gpu({o, k}, kBF16, gen),
         y = Tensor::empty({N, o}, kBF16, gpu());
    auto dy = rand_gpu({N, o}, kBF16, gen), dx = Tensor::empty({N, k}, kBF16, gpu());
    auto dw = Tensor::empty({o, k}, kBF16, gpu());
    const double f = 2.0 * N * k * o;
    add(std::string("gemm ") + what + " fwd bf16", 0, f,
        [=]() mutable { call_kernel<kernels::gemm_k>(x, w, y, false, true, 1.0, 0.0); });
    add(std::string("gemm ") + what + " dX bf16", 0, f,
        [=]() mutable { call_kernel<kernels::gemm_k>(dy, w, dx, false, false, 1.0, 0.0); });
    add(std::string("gemm ") + what + " dW bf16", 0, f,
        [=]() mutable { call_kernel<kernels::gemm_k>(dy, x, dw, true, false, 1.0, 0.0); });
  }
  // The MLP's GELU backward fused into the GEMM bringing its gradient (the proj dX form above):
  // dh = (dy · w_proj) ⊙ gelu'(pre), dbias = Σ over rows of dh; the GEMM's FLOPs.
  {
    const int64_t H = 4 * C;
    auto dy = rand_gpu({N, C}, kBF16, gen), w = rand_gpu({C, H}, kBF16, gen);
    auto pre = rand_gpu({N, H}, kBF16, gen), dpre = Tensor::empty({N, H}, kBF16, gpu());
    auto dbias = Tensor::empty({H}, kBF16, gpu());
    add("gemm_dgelu_bgrad proj dX bf16", 0, 2.0 * N * C * H, [=]() mutable {
      call_kernel<kernels::gemm_dgelu_bgrad_k>(dy, w, pre, dpre, dbias, false, false);
    });
  }
  // Flash attention, causal, bf16: 16 heads of D = 64 or 128, T = 1024 / 2048 / 4096.
  for (int64_t D : {64, 128}) {
    for (int64_t T : {1024, 2048, 4096}) {
      const int64_t B = 4, H = 16;
      auto q = rand_gpu({B, H, T, D}, kBF16, gen), k = rand_gpu({B, H, T, D}, kBF16, gen);
      auto v = rand_gpu({B, H, T, D}, kBF16, gen), out = Tensor::empty({B, H, T, D}, kBF16, gpu());
      auto lse = Tensor::empty({B, H, T}, DType::kF32, gpu());
      auto dout = rand_gpu({B, H, T, D}, kBF16, gen);
      auto dq = rand_gpu({B, H, T, D}, kBF16, gen), dk = rand_gpu({B, H, T, D}, kBF16, gen);
      auto dv = rand_gpu({B, H, T, D}, kBF16, gen);
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      const double f = 4.0 * B * H * static_cast<double>(T) * T * D / 2;
      const std::string tag = " T=" + std::to_string(T) + " D=" + std::to_string(D);
      add("attention_forward" + tag, 0, f, [=]() mutable {
        call_kernel<kernels::attention_forward_k>(q, k, v, Tensor(), scale, out, lse);
      });
      prime(cases.back().launch);
      add("attention_backward" + tag, 0, 2.5 * f, [=]() mutable {
        call_kernel<kernels::attention_backward_k>(q, k, v, Tensor(), out, lse, dout, scale, dq, dk,
                                                   dv);
      });
      // The same through cuDNN's fused attention (Note [cuDNN attention]), when built; the
      // first launch builds the graph, before the timing.
      if (!kernels::cudnn_attention_built()) continue;
      add("attention_forward cudnn" + tag, 0, f, [=]() mutable {
        kernels::CudnnAttentionGuard cudnn;
        call_kernel<kernels::attention_forward_k>(q, k, v, Tensor(), scale, out, lse);
      });
      prime(cases.back().launch);
      add("attention_backward cudnn" + tag, 0, 2.5 * f, [=]() mutable {
        kernels::CudnnAttentionGuard cudnn;
        call_kernel<kernels::attention_backward_k>(q, k, v, Tensor(), out, lse, dout, scale, dq, dk,
                                                   dv);
      });
    }
  }
  return cases;
}

int run(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (!kernels::Registry::instance().has("device_count", DeviceType::kCuda) ||
      kernels::find_kernel<kernels::device_count_k>(DeviceType::kCuda)() <= 0) {
    std::printf(
        "gpu_kernels_bench: no CUDA device (or a build without LOOM_CUDA): nothing to measure\n");
    return 0;
  }
  Generator gen(2026);
  const Ceilings ceil = measure_ceilings(gen);
  std::printf(
      "ceilings: device-to-device copy %.0f GB/s (read + write), bf16 GEMM 8192^3 %.1f TFLOP/s\n",
      ceil.copy_bytes_per_s / 1e9, ceil.gemm_flops_per_s / 1e12);
  std::vector<Case> cases = make_cases(gen);
  std::vector<Result> results(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    Case* c = &cases[i];
    Result* r = &results[i];
    r->name = c->name;
    r->is_flops = c->flops > 0;
    benchmark::RegisterBenchmark(
        c->name.c_str(),
        [c, r, ceil](benchmark::State& st) {
          std::vector<double> times;
          try {
            const Tensor probe = Tensor::empty({1}, DType::kF32, gpu());
            for (auto _ : st) {
              const double s = seconds_per_launch(c->launch, probe, 10);
              st.SetIterationTime(s);
              times.push_back(s);
            }
          } catch (const std::exception& e) {
            r->error = e.what();
            st.SkipWithError(e.what());
            return;
          }
          std::sort(times.begin(), times.end());
          r->seconds = times[times.size() / 2];
          r->rate = (r->is_flops ? c->flops : c->bytes) / r->seconds;
          r->fraction = r->rate / (r->is_flops ? ceil.gemm_flops_per_s : ceil.copy_bytes_per_s);
          st.counters[r->is_flops ? "TFLOP/s" : "GB/s"] = r->rate / (r->is_flops ? 1e12 : 1e9);
          st.counters["of_ceiling"] = r->fraction;
        })
        ->UseManualTime()
        ->Iterations(5)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::printf("\n%-34s %10s %12s %10s\n", "kernel", "time (us)", "achieved", "of ceiling");
  for (const Result& r : results) {
    if (!r.error.empty()) {
      std::printf("%-34s  error: %.60s\n", r.name.c_str(), r.error.c_str());
    } else if (r.seconds > 0) {
      std::printf("%-34s %10.1f %8.1f %s %9.0f%%\n", r.name.c_str(), r.seconds * 1e6,
                  r.rate / (r.is_flops ? 1e12 : 1e9), r.is_flops ? "TF/s" : "GB/s",
                  100 * r.fraction);
    }
  }
  std::printf("ceilings: copy %.0f GB/s, bf16 GEMM %.1f TFLOP/s\n", ceil.copy_bytes_per_s / 1e9,
              ceil.gemm_flops_per_s / 1e12);
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  try {
    return loom::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernels_bench: %s\n", e.what());
    return 1;
  }
}
