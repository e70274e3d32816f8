// parallel/tp/cross_entropy.cpp — vocab-parallel cross-entropy (see the header).
//
// Note [Vocab-parallel lse]: every rank all-gathers the group's local log-sum-exps (N each) and
// all-reduces the target logits (one rank contributes each row); vocab_parallel_lse_combine
// (Note [Vocab-parallel lse combine] in kernels/cross_entropy.h) then combines them where they
// live, in rank order in double, lse = m + log Σ_r exp(lse_r − m) with m the largest, so every
// rank computes the same bits, and reduces the row losses to the mean. Nothing (N)-sized is read
// on the host, so a CUDA step does not wait for the device here:
//   - count: the combine kernel counts the non-ignored rows on the device (it reads the targets
//     anyway) and writes 1/count as a 0-d f64 tensor. The backward multiplies dloss by it in
//     f64 and rounds once to the statistics dtype, then calls the backward kernel with
//     grad_scale 1: the bits the former host factor gave (dloss · (1/count), rounded once).
//     Counting host targets on the host would save nothing and need a second code path.
//   - range checks: targets the caller holds on the host (the trainer's batches always are,
//     data/loader.h) are checked here, before any collective, with the error naming the row;
//     they are then copied to the logits' device. Targets already on a device are not read
//     back: an out-of-range target there gives that row, and so the loss, NaN (the CUDA
//     kernels' rule) instead of an error.
// On the CPU every step is the former host loop's arithmetic in the same order (the mean in row
// order, lse rounded once to its dtype), so results are bit-identical to it.
#include "parallel/tp/cross_entropy.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "kernels/cross_entropy.h"
#include "parallel/tp/comm_ops.h"

namespace loom::parallel::tp {

Tensor vocab_parallel_cross_entropy(const Tensor& logits_local, const Tensor& targets,
                                    int64_t ignore_index, int64_t vocab_size, Communicator& group) {
  const char* op = "vocab_parallel_cross_entropy";
  LOOM_CHECK(logits_local.dim() >= 1 && logits_local.size(-1) > 0, op,
             ": logits must be (..., Vp/tp), got ", shape_str(logits_local.shape()));
  const int64_t vl = logits_local.size(-1);
  const int64_t n = logits_local.numel() / vl;
  const int64_t start = group.rank() * vl;
  const int64_t valid = std::clamp<int64_t>(vocab_size - start, 0, vl);
  LOOM_CHECK(vocab_size <= vl * group.size(), op, ": vocab_size ", vocab_size, " exceeds the ",
             vl * group.size(), " columns of the group");
  LOOM_CHECK(valid >= 1, op, ": rank ", group.rank(), " of ", group.name(),
             " holds only padding columns (vocab_size ", vocab_size, ", ", vl,
             " per rank); pad the vocabulary less or use a smaller tensor-parallel size");
  LOOM_CHECK(targets.numel() == n && !is_floating(targets.dtype()), op, ": targets ",
             shape_str(targets.shape()), " do not match logits ", shape_str(logits_local.shape()));

  const Tensor x = ops::contiguous(ops::reshape(logits_local.detach(), {n, vl}));
  const Tensor t_in = ops::contiguous(ops::reshape(targets.detach(), {n}));
  if (t_in.device().is_cpu()) {  // Note [Vocab-parallel lse]: host targets are checked here
    LOOM_DISPATCH_INDEX(t_in.dtype(), op, [&] {
      const index_t* p = t_in.data<index_t>();
      for (int64_t r = 0; r < n; ++r) {
        const auto id = static_cast<int64_t>(p[r]);
        LOOM_CHECK(id == ignore_index || (id >= 0 && id < vocab_size), op, ": target ", id,
                   " at row ", r, " is outside [0, ", vocab_size, ") and is not ignore_index (",
                   ignore_index, ")");
      }
    });
  }
  const Tensor t = t_in.to(x.device());
  const DType stat = is_floating(x.dtype()) && dtype_size(x.dtype()) < 4 ? DType::kF32 : x.dtype();
  Tensor lse_local = Tensor::empty({n}, stat, x.device()),
         tl = Tensor::empty({n}, stat, x.device());
  kernels::call_kernel<kernels::vocab_parallel_ce_forward_k>(x, t, ignore_index, start, valid,
                                                             lse_local, tl);
  const Tensor lses = ops::reshape(all_gather_dim(lse_local, group, 0), {group.size(), n});
  const Tensor tl_sum = all_reduce_sum(tl, group);
  Tensor lse = Tensor::empty({n}, stat, x.device());
  Tensor row_loss = Tensor::empty({n}, DType::kF64, x.device());
  Tensor loss = Tensor::empty({}, stat, x.device());
  Tensor inv_count = Tensor::empty({}, DType::kF64, x.device());
  kernels::call_kernel<kernels::vocab_parallel_lse_combine_k>(
      lses, tl_sum, t, ignore_index, vocab_size, lse, row_loss, loss, inv_count);
  if (autograd::needs_grad({&logits_local})) {
    const Shape shape = logits_local.shape();
    autograd::record_function(op, {logits_local}, {&loss}, [=](const std::vector<Tensor>& gr) {
      Tensor dx = Tensor::zeros({n, vl}, x.dtype(), x.device());
      if (gr[0].defined()) {
        autograd::NoGradGuard no_grad;
        // dloss · (1/count) in f64, rounded once (Note [Vocab-parallel lse]).
        const Tensor d64 = ops::to_dtype(ops::reshape(ops::contiguous(gr[0]), {}), DType::kF64);
        const Tensor dloss = ops::contiguous(ops::to_dtype(ops::mul(d64, inv_count), stat));
        kernels::call_kernel<kernels::vocab_parallel_ce_backward_k>(x, t, lse, dloss, 1.0,
                                                                    ignore_index, start, valid, dx);
      }
      return std::vector<Tensor>{ops::reshape(dx, shape)};
    });
  }
  return loss;
}

}  // namespace loom::parallel::tp
