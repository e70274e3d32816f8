// tools/bench/cuda_rows_bench.cpp — achieved memory bandwidth of the CUDA row kernels
// (LayerNorm, RMSNorm, residual LayerNorm, softmax, RoPE; forward and backward) at GPT-2 and
// Llama shapes, next to a large device-to-device copy (the ceiling they are measured against;
// the target is ≥ 80% of it). Bytes counted are the tensors each kernel must read and write once
// (backward kernels read and write dx). Each iteration issues 20 calls, then waits for them by a
// one-element device-to-host copy. A measurement, never a test: it asserts nothing about speed.
// Without a GPU every benchmark reports "no CUDA device".
//
//   build/bin/cuda_rows_bench [--benchmark_filter=...]
//
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/copy.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/softmax.h"

namespace loom {
namespace {

constexpr int kCallsPerIteration = 20;

// Waits for all work issued so far: a blocking device-to-host copy is ordered after it.
void wait_for(const Tensor& t) { (void)t.reshape({t.numel()}).narrow(0, 0, 1).to(Device::cpu()); }

// positions 0 … t_len − 1 (i64) on the GPU.
Tensor gpu_positions(int64_t t_len) {
  std::vector<int64_t> pos(static_cast<size_t>(t_len));
  std::iota(pos.begin(), pos.end(), int64_t{0});
  return Tensor::from_vector(pos, {t_len}).to(Device::cuda());
}

Tensor gpu_random(const Shape& shape, DType dt, Generator& gen) {
  return randn(shape, gen, DType::kF32).to(dt).to(Device::cuda());
}

// Registers one benchmark: make() builds the operands and returns the call to time.
void add(const std::string& name, int64_t bytes_per_call,
         std::function<std::function<void()>()> make) {
  benchmark::RegisterBenchmark(
      name.c_str(),
      [bytes_per_call, make](benchmark::State& state) {
        if (device_count(DeviceType::kCuda) == 0) {
          state.SkipWithError("no CUDA device");
          return;
        }
        Tensor probe = Tensor::empty({1}, DType::kF32, Device::cuda());
        const std::function<void()> call = make();
        call();
        wait_for(probe);
        for (auto _ : state) {
          for (int i = 0; i < kCallsPerIteration; ++i) call();
          wait_for(probe);
        }
        state.SetBytesProcessed(state.iterations() * kCallsPerIteration * bytes_per_call);
      })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

std::string shape_name(const char* op, DType dt, const Shape& s) {
  return std::string(op) + "/" + dtype_name(dt) + shape_str(s);
}

void register_all() {
  auto gen = std::make_shared<Generator>(1);
  {
    const int64_t n = int64_t{1} << 28;  // 512 MiB of bf16
    add("copy_d2d/bf16(268435456)", 2 * n * 2, [n, gen] {
      Tensor a = gpu_random({n}, DType::kBF16, *gen), b = Tensor::empty_like(a);
      return std::function<void()>(
          [a, b]() mutable { kernels::call_kernel<kernels::copy_k>(a, b); });
    });
  }
  struct Rows {
    DType dt;
    int64_t n, c;
  };
  for (const Rows& r : {Rows{DType::kBF16, 16384, 768}, Rows{DType::kBF16, 8192, 1600},
                        Rows{DType::kBF16, 8192, 4096}, Rows{DType::kF32, 8192, 8192}}) {
    const Shape s{r.n, r.c};
    const int64_t es = static_cast<int64_t>(dtype_size(r.dt)), nc = r.n * r.c;
    const DType sd = kernels::norm_stat_dtype(r.dt);
    add(shape_name("layer_norm_forward", r.dt, s), 2 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), w = gpu_random({r.c}, r.dt, *gen);
      Tensor b = gpu_random({r.c}, r.dt, *gen), y = Tensor::empty_like(x);
      Tensor m = Tensor::empty({r.n}, sd, Device::cuda()), q = Tensor::empty_like(m);
      return std::function<void()>([=]() mutable {
        kernels::call_kernel<kernels::layer_norm_forward_k>(x, w, b, 1e-5, y, m, q);
      });
    });
    add(shape_name("layer_norm_backward", r.dt, s), 4 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), w = gpu_random({r.c}, r.dt, *gen);
      Tensor b = gpu_random({r.c}, r.dt, *gen), y = Tensor::empty_like(x);
      Tensor m = Tensor::empty({r.n}, sd, Device::cuda()), q = Tensor::empty_like(m);
      kernels::call_kernel<kernels::layer_norm_forward_k>(x, w, b, 1e-5, y, m, q);
      Tensor dy = gpu_random(s, r.dt, *gen), dx = Tensor::zeros_like(x);
      Tensor dw = Tensor::zeros_like(w), db = Tensor::zeros_like(b);
      return std::function<void()>([=]() mutable {
        kernels::call_kernel<kernels::layer_norm_backward_k>(dy, x, w, m, q, dx, dw, db);
      });
    });
    add(shape_name("rms_norm_forward", r.dt, s), 2 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), w = gpu_random({r.c}, r.dt, *gen);
      Tensor y = Tensor::empty_like(x), q = Tensor::empty({r.n}, sd, Device::cuda());
      return std::function<void()>(
          [=]() mutable { kernels::call_kernel<kernels::rms_norm_forward_k>(x, w, 1e-5, y, q); });
    });
    add(shape_name("rms_norm_backward", r.dt, s), 4 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), w = gpu_random({r.c}, r.dt, *gen);
      Tensor y = Tensor::empty_like(x), q = Tensor::empty({r.n}, sd, Device::cuda());
      kernels::call_kernel<kernels::rms_norm_forward_k>(x, w, 1e-5, y, q);
      Tensor dy = gpu_random(s, r.dt, *gen), dx = Tensor::zeros_like(x), dw = Tensor::zeros_like(w);
      return std::function<void()>([=]() mutable {
        kernels::call_kernel<kernels::rms_norm_backward_k>(dy, x, w, q, dx, dw);
      });
    });
    add(shape_name("residual_layer_norm_forward", r.dt, s), 4 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), res = gpu_random(s, r.dt, *gen);
      Tensor w = gpu_random({r.c}, r.dt, *gen), b = gpu_random({r.c}, r.dt, *gen);
      Tensor sum = Tensor::empty_like(x), y = Tensor::empty_like(x);
      Tensor m = Tensor::empty({r.n}, sd, Device::cuda()), q = Tensor::empty_like(m);
      return std::function<void()>([=]() mutable {
        kernels::call_kernel<kernels::residual_layer_norm_forward_k>(x, res, w, b, 1e-5, sum, y, m,
                                                                     q);
      });
    });
    add(shape_name("softmax_forward", r.dt, s), 2 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), y = Tensor::empty_like(x);
      return std::function<void()>(
          [=]() mutable { kernels::call_kernel<kernels::softmax_forward_k>(x, y); });
    });
    add(shape_name("softmax_backward", r.dt, s), 4 * nc * es, [=] {
      Tensor x = gpu_random(s, r.dt, *gen), y = Tensor::empty_like(x);
      kernels::call_kernel<kernels::softmax_forward_k>(x, y);
      Tensor dy = gpu_random(s, r.dt, *gen), dx = Tensor::zeros_like(x);
      return std::function<void()>(
          [=]() mutable { kernels::call_kernel<kernels::softmax_backward_k>(y, dy, dx); });
    });
  }
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const Shape s{8, 1024, 32, 128};  // Llama-8B attention: (B, T, H, D)
    const int64_t bytes = shape_numel(s) * static_cast<int64_t>(dtype_size(dt));
    add(shape_name("rope_forward", dt, s), 2 * bytes, [=] {
      Tensor x = gpu_random(s, dt, *gen), y = Tensor::empty_like(x);
      Tensor pos = gpu_positions(s[1]);
      return std::function<void()>(
          [=, f = kernels::RopeFrequencies::plain(500000.0, s[3])]() mutable {
            kernels::call_kernel<kernels::rope_forward_k>(x, pos, f, y);
          });
    });
    add(shape_name("rope_backward", dt, s), 3 * bytes, [=] {
      Tensor dy = gpu_random(s, dt, *gen), dx = Tensor::zeros_like(dy);
      Tensor pos = gpu_positions(s[1]);
      return std::function<void()>(
          [=, f = kernels::RopeFrequencies::plain(500000.0, s[3])]() mutable {
            kernels::call_kernel<kernels::rope_backward_k>(dy, pos, f, dx);
          });
    });
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  loom::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
