// core/ops/elementwise.cpp — add/sub/mul/div/scale front-ends and their backward rules.
// Broadcast operands are expanded as stride-0 views (no copy); gradients are summed back to
// each operand's shape with sum_to_shape.
#include "core/ops/elementwise.h"

#include "core/autograd.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "kernels/elementwise.h"

namespace loom::ops {

using kernels::BinaryOp;

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    LOOM_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
               " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
  }
  return "?";
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.dtype() == b.dtype(), op_name(op), ": dtypes ", dtype_name(a.dtype()), " and ",
             dtype_name(b.dtype()), " differ");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op_name(op));
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  {
    const Tensor ea = a.shape() == shape ? a.detach() : expand(a.detach(), shape);
    const Tensor eb = b.shape() == shape ? b.detach() : expand(b.detach(), shape);
    kernels::call_kernel<kernels::binary_forward_k>(op, ea, eb, out);
  }
  if (autograd::needs_grad({&a, &b})) {
    const Shape sa = a.shape(), sb = b.shape();
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    // mul/div need the operands; add/sub do not (saved detached: no reference cycles).
    Tensor a_saved = (op == BinaryOp::kMul || op == BinaryOp::kDiv) && gb ? a.detach() : Tensor();
    Tensor b_saved = (op == BinaryOp::kMul || op == BinaryOp::kDiv) ? b.detach() : Tensor();
    autograd::record_function(op_name(op), {a, b}, {&out}, [=](const std::vector<Tensor>& g) {
      const Tensor& d = g[0];
      Tensor da, db;
      switch (op) {
        case BinaryOp::kAdd:
          if (ga) da = d;
          if (gb) db = d;
          break;
        case BinaryOp::kSub:
          if (ga) da = d;
          if (gb) db = scale(d, -1.0);
          break;
        case BinaryOp::kMul:
          if (ga) da = mul(d, b_saved);
          if (gb) db = mul(d, a_saved);
          break;
        case BinaryOp::kDiv:
          if (ga) da = div(d, b_saved);
          if (gb) db = scale(div(mul(d, a_saved), mul(b_saved, b_saved)), -1.0);
          break;
      }
      return std::vector<Tensor>{da.defined() ? sum_to_shape(da, sa) : da,
                                 db.defined() ? sum_to_shape(db, sb) : db};
    });
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kAdd, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kSub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kMul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::kDiv, a, b); }

Tensor scale(const Tensor& x, double alpha) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0) kernels::call_kernel<kernels::scale_forward_k>(x, alpha, out);
  if (autograd::needs_grad({&x})) {
    autograd::record_function("scale", {x}, {&out}, [alpha](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{scale(g[0], alpha)};
    });
  }
  return out;
}

void add_(Tensor& acc, const Tensor& x, double alpha) {
  LOOM_CHECK(acc.shape() == x.shape(), "add_: shapes ", shape_str(acc.shape()), " and ",
             shape_str(x.shape()), " differ");
  LOOM_CHECK(acc.dtype() == x.dtype(), "add_: dtypes differ");
  if (acc.numel() > 0) kernels::call_kernel<kernels::axpy_k>(alpha, x, acc);
}

}  // namespace loom::ops
