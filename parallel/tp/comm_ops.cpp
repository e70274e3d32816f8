// parallel/tp/comm_ops.cpp — the matched TP/SP communication ops (see the table in the header).
// Each op computes its forward on detached tensors under NoGradGuard and records one autograd
// node whose backward runs the conjugate collective.
#include "parallel/tp/comm_ops.h"

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/view.h"

namespace loom::parallel::tp {
namespace {

int64_t checked_dim(const Tensor& x, const Communicator& group, int64_t dim, const char* op) {
  dim = wrap_dim(dim, x.dim(), op);
  LOOM_CHECK(x.size(dim) % group.size() == 0, op, ": dim ", dim, " of ", shape_str(x.shape()),
             " does not divide by the ", group.name(), " group size ", group.size());
  return dim;
}

// Flat 1-d view of a contiguous tensor (the communicator's buffers are flat).
Tensor flat(const Tensor& t) { return ops::view(t, {t.numel()}); }

// Records `name` with one input and one output whose backward is `bwd(grad)`.
template <typename Bwd>
Tensor record(const char* name, const Tensor& x, Tensor out, Bwd bwd) {
  if (autograd::needs_grad({&x})) {
    autograd::record_function(name, {x}, {&out}, [bwd](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? bwd(g[0]) : Tensor()};
    });
  }
  return out;
}

}  // namespace

Tensor all_reduce_sum(const Tensor& x, Communicator& group) {
  autograd::NoGradGuard no_grad;
  Tensor out = ops::clone(x.detach());
  if (group.size() > 1) group.all_reduce(flat(out), ReduceOp::kSum);
  return out;
}

Tensor all_gather_dim(const Tensor& x, Communicator& group, int64_t dim) {
  autograd::NoGradGuard no_grad;
  dim = wrap_dim(dim, x.dim(), "all_gather_dim");
  const Tensor xc = ops::contiguous(x.detach());
  const int n = group.size();
  if (n == 1) return ops::clone(xc);
  Shape stacked = xc.shape();
  stacked.insert(stacked.begin(), n);
  Tensor all = Tensor::empty(stacked, xc.dtype(), xc.device());  // (n, *x.shape), rank order
  group.all_gather(flat(xc), flat(all));
  if (dim == 0) {
    Shape s = xc.shape();
    s[0] *= n;
    return ops::view(all, s);
  }
  std::vector<Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(ops::squeeze(ops::narrow(all, 0, r, 1), 0));
  return ops::cat(parts, dim);
}

Tensor reduce_scatter_dim(const Tensor& x, Communicator& group, int64_t dim) {
  autograd::NoGradGuard no_grad;
  dim = checked_dim(x, group, dim, "reduce_scatter_dim");
  const int n = group.size();
  if (n == 1) return ops::clone(x.detach());
  const int64_t len = x.size(dim) / n;
  // Chunk r of the flat send buffer must be this rank's contribution to member r's chunk.
  std::vector<Tensor> parts;
  for (int r = 0; r < n; ++r)
    parts.push_back(ops::unsqueeze(ops::narrow(x.detach(), dim, r * len, len), 0));
  const Tensor send = ops::contiguous(ops::cat(parts, 0));
  Shape s = x.shape();
  s[static_cast<size_t>(dim)] = len;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  group.reduce_scatter(flat(send), flat(out), ReduceOp::kSum);
  return out;
}

Tensor chunk_dim(const Tensor& x, Communicator& group, int64_t dim) {
  autograd::NoGradGuard no_grad;
  dim = checked_dim(x, group, dim, "chunk_dim");
  const int64_t len = x.size(dim) / group.size();
  return ops::clone(ops::narrow(x.detach(), dim, group.rank() * len, len));
}

Tensor copy_to_region(const Tensor& x, Communicator& group) {
  Communicator* g = &group;
  return record("tp_copy_to_region", x, ops::clone(x.detach()),
                [g](const Tensor& dy) { return all_reduce_sum(dy, *g); });
}

Tensor reduce_from_region(const Tensor& x, Communicator& group) {
  return record("tp_reduce_from_region", x, all_reduce_sum(x, group),
                [](const Tensor& dy) { return dy; });
}

Tensor scatter_to_region(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  const int64_t d = checked_dim(x, group, dim, "scatter_to_region");
  return record("tp_scatter_to_region", x, chunk_dim(x, group, d),
                [g, d](const Tensor& dy) { return all_gather_dim(dy, *g, d); });
}

Tensor gather_from_region(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  const int64_t d = wrap_dim(dim, x.dim(), "gather_from_region");
  return record("tp_gather_from_region", x, all_gather_dim(x, group, d),
                [g, d](const Tensor& dy) { return chunk_dim(dy, *g, d); });
}

Tensor gather_from_sequence(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  const int64_t d = wrap_dim(dim, x.dim(), "gather_from_sequence");
  return record("sp_gather_from_sequence", x, all_gather_dim(x, group, d),
                [g, d](const Tensor& dy) { return reduce_scatter_dim(dy, *g, d); });
}

Tensor reduce_scatter_to_sequence(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  const int64_t d = checked_dim(x, group, dim, "reduce_scatter_to_sequence");
  return record("sp_reduce_scatter_to_sequence", x, reduce_scatter_dim(x, group, d),
                [g, d](const Tensor& dy) { return all_gather_dim(dy, *g, d); });
}

}  // namespace loom::parallel::tp
