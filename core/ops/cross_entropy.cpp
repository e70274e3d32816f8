// core/ops/cross_entropy.cpp — softmax_cross_entropy front-end: flattens to (N, Vp), counts
// the non-ignored rows, reduces the per-row losses to their mean, and records a backward node
// that saves logits, targets and lse (never probabilities).
//
// Note [Cross-entropy count]: the mean's denominator (the number of non-ignored rows) is a host
// number, passed to the backward kernel as grad_scale. Targets on the CPU are counted in place;
// targets on a device are counted from the caller's host copy when one is passed (the trainer
// passes the batch it copied to the device), else copied to the host once per forward, which
// waits for the device.
#include "core/ops/cross_entropy.h"

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "kernels/cross_entropy.h"

namespace loom::ops {
namespace {

// Rows of targets (N) that are not ignore_index; checks the others lie in [0, vocab).
int64_t count_targets(const Tensor& targets, int64_t ignore_index, int64_t vocab) {
  const Tensor host = contiguous(targets.device().is_cpu() ? targets : targets.to(Device::cpu()));
  int64_t count = 0;
  LOOM_DISPATCH_INDEX(host.dtype(), "softmax_cross_entropy", [&] {
    const index_t* p = host.data<index_t>();
    for (int64_t r = 0; r < host.numel(); ++r) {
      const int64_t t = static_cast<int64_t>(p[r]);
      if (t == ignore_index) continue;
      LOOM_CHECK(t >= 0 && t < vocab, "softmax_cross_entropy: target ", t, " at row ", r,
                 " is outside [0, ", vocab, ") and is not ignore_index (", ignore_index, ")");
      ++count;
    }
  });
  return count;
}

}  // namespace

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             int64_t vocab_size, const Tensor& host_targets) {
  LOOM_CHECK(logits.dim() >= 1 && logits.size(-1) > 0,
             "softmax_cross_entropy: logits must be (..., Vp) with Vp > 0, got ",
             shape_str(logits.shape()));
  const int64_t vp = logits.size(-1);
  const int64_t n = logits.numel() / vp;
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  LOOM_CHECK(targets.shape() == lead || (targets.dim() == 1 && targets.size(0) == n),
             "softmax_cross_entropy: targets ", shape_str(targets.shape()), " do not match logits ",
             shape_str(logits.shape()));
  LOOM_CHECK(!is_floating(targets.dtype()), "softmax_cross_entropy: targets must be integer, got ",
             dtype_name(targets.dtype()));
  if (vocab_size <= 0) vocab_size = vp;
  LOOM_CHECK(vocab_size <= vp, "softmax_cross_entropy: vocab_size ", vocab_size,
             " exceeds the logits' last dim ", vp);
  const Tensor x = contiguous(reshape(logits.detach(), {n, vp}));
  const Tensor t = contiguous(reshape(targets.detach(), {n}));
  if (host_targets.defined()) {
    LOOM_CHECK(host_targets.device().is_cpu() && host_targets.numel() == n,
               "softmax_cross_entropy: host_targets must be a CPU tensor of ", n, " targets, got ",
               shape_str(host_targets.shape()), " on ", host_targets.device().str());
  }
  const int64_t count =
      count_targets(host_targets.defined() ? host_targets : t, ignore_index, vocab_size);
  const double inv_count = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  // lse and per-row loss: f32 for 16-bit logits (Note [Cross-entropy kernel contract]).
  const DType row_dtype = logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  Tensor rows = Tensor::empty({n}, row_dtype, logits.device());
  Tensor lse = Tensor::empty({n}, row_dtype, logits.device());
  if (n > 0) {
    kernels::call_kernel<kernels::cross_entropy_forward_k>(x, t, ignore_index, vocab_size, rows,
                                                           lse);
  }
  Tensor loss;
  {
    autograd::NoGradGuard no_grad;
    loss = n > 0 ? scale(sum(rows), inv_count) : Tensor::zeros({}, row_dtype, logits.device());
  }
  if (autograd::needs_grad({&logits})) {
    const Shape shape = logits.shape();
    autograd::record_function(
        "softmax_cross_entropy", {logits}, {&loss}, [=](const std::vector<Tensor>& g) {
          Tensor dx = Tensor::zeros({n, vp}, x.dtype(), x.device());
          if (n > 0 && count > 0) {
            kernels::call_kernel<kernels::cross_entropy_backward_k>(
                x, t, lse, contiguous(g[0]), inv_count, ignore_index, vocab_size, dx);
          }
          return std::vector<Tensor>{reshape(dx, shape)};
        });
  }
  return loss;
}

}  // namespace loom::ops
