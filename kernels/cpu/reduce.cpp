// kernels/cpu/reduce.cpp — CPU sum over one dimension (rows reduced in double for f32) and the
// sum of squares used by gradient norms, and the clipping and loss-scaling factors from it.
#include "kernels/reduce.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

void sum_dim_forward_cpu(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& out) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "sum_dim_forward", [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* po = out.data<scalar_t>();
    if (inner == 1) {
      parallel_for(outer, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(n, 1)),
                   [&](int64_t lo, int64_t hi) {
                     for (int64_t o = lo; o < hi; ++o) {
                       double acc = 0;
                       const scalar_t* row = px + o * n;
                       LOOM_SIMD_SUM(acc)
                       for (int64_t j = 0; j < n; ++j) acc += row[j];
                       po[o] = static_cast<scalar_t>(acc);
                     }
                   });
      return;
    }
    // Column sums: parallel over (outer, blocks of inner); each block walks n in order.
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
    parallel_for(outer * blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / blocks;
        const int64_t c0 = (t % blocks) * kBlock;
        const int64_t c1 = std::min(inner, c0 + kBlock);
        double acc[kBlock] = {};
        for (int64_t j = 0; j < n; ++j) {
          const scalar_t* row = px + (o * n + j) * inner;
          LOOM_SIMD
          for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
        }
        for (int64_t c = c0; c < c1; ++c) po[o * inner + c] = static_cast<scalar_t>(acc[c - c0]);
      }
    });
  });
}

void sum_squares_forward_cpu(const Tensor& x, Tensor& out) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "sum_squares_forward", [&] {
    const scalar_t* px = x.data<scalar_t>();
    const int64_t n = x.numel();
    const int64_t chunks = (n + kElementGrain - 1) / kElementGrain;
    std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(chunks, 1)), 0.0);
    parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
      double acc = 0;
      LOOM_SIMD_SUM(acc)
      for (int64_t i = lo; i < hi; ++i)
        acc += static_cast<double>(px[i]) * static_cast<double>(px[i]);
      partial[static_cast<size_t>(lo / kElementGrain)] = acc;
    });
    double total = 0;
    for (double p : partial) total += p;
    *out.data<double>() = total;
  });
}

void clip_factor_forward_cpu(const Tensor& sq_sum, double max_norm, Tensor& out) {
  LOOM_CHECK(sq_sum.numel() == 1 && sq_sum.dtype() == DType::kF64 && out.numel() == 1 &&
                 out.dtype() == DType::kF64,
             "clip_factor_forward: sq_sum and out must be one f64 element each");
  *out.data<double>() = clip_factor(std::sqrt(*sq_sum.data<double>()), max_norm);
}

void loss_scale_step_cpu(const Tensor& sq_sum, Tensor& state, double max_norm,
                         int64_t growth_interval, Tensor& factor) {
  check_loss_scale_step_args(sq_sum, state, growth_interval, factor);
  *factor.data<double>() =
      loss_scale_step_values(std::sqrt(*sq_sum.data<double>()), max_norm,
                             static_cast<double>(growth_interval), state.data<double>());
}

}  // namespace

LOOM_REGISTER_KERNEL(sum_dim_forward, kCpu, sum_dim_forward_cpu);
LOOM_REGISTER_KERNEL(sum_squares_forward, kCpu, sum_squares_forward_cpu);
LOOM_REGISTER_KERNEL(clip_factor_forward, kCpu, clip_factor_forward_cpu);
LOOM_REGISTER_KERNEL(loss_scale_step, kCpu, loss_scale_step_cpu);

}  // namespace loom::kernels::cpu
