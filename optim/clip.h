// optim/clip.h — global gradient-norm computation and clipping, in double and deterministic
// (sums in a fixed order, independent of the thread count). Single-process only here: the
// cross-shard reduction is the caller's, see Note [Clipping under parallelism].
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace loom::optim {

// Note [Clipping under parallelism]: the global norm is sqrt of the sum of squares over ALL
// gradient elements of the model. When gradients are sharded (TP, PP, ZeRO), each rank computes
// grad_sq_sum() over the elements it owns (each element counted on exactly one rank: replicated
// parameters, e.g. TP-replicated norms, on one rank only), the partial sums are all-reduced
// (sum, in double), and only then is the sqrt taken:
//     double norm = std::sqrt(all_reduce_sum(grad_sq_sum(local_grads)));
//     scale_grads(local_grads, clip_scale(norm, max_norm));
// global_grad_norm() and clip_grad_norm() below are exactly that with no reduction.

// Σ g² over every element of every defined tensor, accumulated in double: each tensor summed in
// index order, tensors added in list order. Undefined tensors are skipped.
double grad_sq_sum(const std::vector<Tensor>& grads);
// The same sum left where the gradients live: a 0-d f64 tensor on `device`, where every defined
// gradient must be (default: the gradients' device; the CPU when there are none, or the given
// device, so an empty list still gives a zero there), computed without reading anything back.
// grad_sq_sum() is this, read.
Tensor grad_sq_sum_tensor(const std::vector<Tensor>& grads,
                          std::optional<Device> device = std::nullopt);
// sqrt(grad_sq_sum(grads)).
double global_grad_norm(const std::vector<Tensor>& grads);
// The factor clipping multiplies gradients by: max_norm / norm when norm > max_norm, else 1.
// A non-finite norm gives 1 (the gradients are left as they are for the caller to inspect or
// skip the step). max_norm must be > 0.
double clip_scale(double norm, double max_norm);
// clip_scale(sqrt(sq_sum), max_norm) computed where sq_sum (a 0-d f64 tensor, e.g. from
// grad_sq_sum_tensor) lies, as a 0-d f64 tensor there: nothing is read back.
Tensor clip_scale_tensor(const Tensor& sq_sum, double max_norm);
// g *= factor in place for every defined tensor (the handles are shared, so the callers'
// gradients change).
void scale_grads(const std::vector<Tensor>& grads, double factor);
// Scales the gradients in place so that their global norm is max_norm when it exceeds max_norm;
// returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm);

}  // namespace loom::optim
