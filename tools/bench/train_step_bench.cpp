// tools/bench/train_step_bench.cpp — one GPT-2 124M training step on the CPU (forward, backward,
// AdamW) at B=4, T=64, against the machine's own SGEMM rate measured in the same run; plus peak
// memory against what parameters, gradients, optimizer state and activations need. A
// measurement, never a test.
//
//   build/bin/train_step_bench [--benchmark_repetitions=N]
//
// Model FLOPs per step are Transformer::flops_per_token(T) · B · T (6N + attention, Note
// [Model FLOPs] in layers/transformer.h); the SGEMM reference is cblas_sgemm at 1024³.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <cstdio>

#include "core/autograd.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "optim/decay_rule.h"
#include "tools/bench/cpu_isa.h"

namespace loom {
namespace {

constexpr int64_t kB = 4, kT = 64;

double sgemm_flops() {
  const int n = 1024;
  Generator gen(0);
  Tensor a = randn({n, n}, gen), b = randn({n, n}, gen), c = Tensor::empty({n, n});
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data<float>(), n,
                b.data<float>(), n, 0.f, c.data<float>(), n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / dt);
  }
  return best;
}

ModelConfig gpt2_124m() {
  ModelConfig c;
  c.arch = "gpt2";
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.max_seq_len = 1024;
  return c;
}

void BM_Gpt2TrainStep(benchmark::State& st) {
  const double gemm = sgemm_flops();
  Allocator& alloc = allocator_for(DeviceType::kCpu);
  Generator gen(1);
  Transformer model(gpt2_124m());
  model.init_weights(gen);
  optim::AdamW adam(optim::make_param_refs(model.named_parameters()), 0.9, 0.95, 1e-8, 0.1);
  Tensor ids = randint({kB, kT}, 0, 50257, gen, DType::kI32);
  Tensor targets = randint({kB, kT}, 0, 50257, gen, DType::kI32);
  const int64_t base = alloc.stats().current_bytes;  // parameters + AdamW state
  auto step = [&] {
    adam.zero_grad();
    autograd::backward(model.loss(ids, targets));
    adam.step(1e-4);
  };
  step();  // first step allocates gradients and warms the caches
  alloc.reset_peak();
  double total = 0, t_fwd = 0, t_bwd = 0, t_opt = 0;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    adam.zero_grad();
    Tensor loss = model.loss(ids, targets);
    t_fwd += since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    autograd::backward(loss);
    t_bwd += since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    adam.step(1e-4);
    t_opt += since(t2);
    total += since(t0);
  }
  const double iters = static_cast<double>(st.iterations());
  st.counters["fwd_ms"] = t_fwd / iters * 1e3;
  st.counters["bwd_ms"] = t_bwd / iters * 1e3;
  st.counters["adamw_ms"] = t_opt / iters * 1e3;
  const double per_step = total / static_cast<double>(st.iterations());
  const double flops = model.flops_per_token(kT) * kB * kT;
  const double n = static_cast<double>(model.num_parameters());
  const double peak = static_cast<double>(alloc.stats().peak_bytes);
  st.counters["ms_per_step"] = per_step * 1e3;
  st.counters["GFLOP/s"] = flops / per_step / 1e9;
  st.counters["SGEMM_GFLOP/s"] = gemm / 1e9;
  st.counters["ratio_vs_SGEMM"] = flops / per_step / gemm;
  st.counters["peak_MiB"] = peak / (1 << 20);
  st.counters["state_MiB"] = 16.0 * n / (1 << 20);  // 4Ψ params + 4Ψ grads + 8Ψ AdamW
  st.counters["activations_MiB"] = (peak - static_cast<double>(base) - 4.0 * n) / (1 << 20);
  std::printf(
      "\nGPT-2 124M step, B=%lld T=%lld: %.0f ms, %.1f GFLOP/s = %.2f of SGEMM (%.1f GFLOP/s); "
      "peak %.0f MiB = params+grads+AdamW %.0f MiB + the rest %.0f MiB\n",
      static_cast<long long>(kB), static_cast<long long>(kT), per_step * 1e3,
      flops / per_step / 1e9, flops / per_step / gemm, gemm / 1e9, peak / (1 << 20),
      16.0 * n / (1 << 20), (peak - 16.0 * n) / (1 << 20));
}
BENCHMARK(BM_Gpt2TrainStep)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::bench::benchmark_main(argc, argv); }
