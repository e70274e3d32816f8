// parallel/tp/cross_entropy.cpp — vocab-parallel cross-entropy (see the header).
//
// Note [Vocab-parallel lse]: every rank all-gathers the group's local log-sum-exps (N each)
// and combines them in rank order in double, lse = m + log Σ_r exp(lse_r − m) with m the
// largest, so every rank computes the same bits; the target logit is an all-reduce sum (one
// rank contributes each row). The (N)-vectors are combined on the host: for device tensors
// this reads 2·N values per step (a synchronisation the CUDA path may later move into a kernel).
#include "parallel/tp/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/autograd.h"
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
  const Tensor t = ops::contiguous(ops::reshape(targets.detach(), {n}));
  const DType stat = is_floating(x.dtype()) && dtype_size(x.dtype()) < 4 ? DType::kF32 : x.dtype();
  Tensor lse_local = Tensor::empty({n}, stat, x.device()), tl = Tensor::empty({n}, stat, x.device());
  kernels::call_kernel<kernels::vocab_parallel_ce_forward_k>(x, t, ignore_index, start, valid,
                                                             lse_local, tl);
  const std::vector<double> lses = all_gather_dim(lse_local, group, 0).to(Device::cpu()).to_vector();
  const std::vector<double> tls = all_reduce_sum(tl, group).to(Device::cpu()).to_vector();
  const std::vector<double> ids = t.to(Device::cpu()).to_vector();

  const int g = group.size();
  std::vector<double> lse(static_cast<size_t>(n), 0.0);
  double total = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    const auto id = static_cast<int64_t>(ids[static_cast<size_t>(r)]);
    if (id == ignore_index) continue;
    LOOM_CHECK(id >= 0 && id < vocab_size, op, ": target ", id, " at row ", r, " is outside [0, ",
               vocab_size, ") and is not ignore_index (", ignore_index, ")");
    double m = -INFINITY;
    for (int q = 0; q < g; ++q) m = std::max(m, lses[static_cast<size_t>(q * n + r)]);
    double s = 0.0;
    for (int q = 0; q < g; ++q) s += std::exp(lses[static_cast<size_t>(q * n + r)] - m);
    lse[static_cast<size_t>(r)] = m + std::log(s);
    total += lse[static_cast<size_t>(r)] - tls[static_cast<size_t>(r)];
    ++count;
  }
  const double mean = count > 0 ? total / static_cast<double>(count) : 0.0;
  Tensor loss = Tensor::full({}, mean, stat, x.device());
  if (autograd::needs_grad({&logits_local})) {
    const Tensor lse_t = Tensor::from_vector(lse, {n}).to(stat).to(x.device());
    const Shape shape = logits_local.shape();
    const double scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
    autograd::record_function(op, {logits_local}, {&loss}, [=](const std::vector<Tensor>& gr) {
      Tensor dx = Tensor::zeros({n, vl}, x.dtype(), x.device());
      if (gr[0].defined() && count > 0) {
        kernels::call_kernel<kernels::vocab_parallel_ce_backward_k>(
            x, t, lse_t, ops::contiguous(gr[0]), scale, ignore_index, start, valid, dx);
      }
      return std::vector<Tensor>{ops::reshape(dx, shape)};
    });
  }
  return loss;
}

}  // namespace loom::parallel::tp
