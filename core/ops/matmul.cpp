// core/ops/matmul.cpp — matmul front-end. The backward of C = op(A)·op(B) is, per flag:
//   dA = dC·op(B)ᵀ  (or op(B)·dCᵀ when A was transposed)
//   dB = op(A)ᵀ·dC  (or dCᵀ·op(A) when B was transposed)
// each expressed as another matmul call, so no transpose is ever materialised.
#include "core/ops/matmul.h"

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/matmul.h"

namespace loom::ops {
namespace {

// Returns x in a layout GEMM reads directly (unit stride in the last dim), flipping `trans`
// when x is a transposed view; copies only when neither layout fits.
Tensor gemm_operand(const Tensor& x, bool& trans) {
  const int64_t r = x.size(-2), c = x.size(-1);
  const bool batch_ok = x.dim() == 2 || x.size(0) == 1 || x.stride(0) >= r * c;
  if (batch_ok && (x.stride(-1) == 1 || c == 1) && x.stride(-2) >= std::max<int64_t>(c, 1)) {
    return (x.stride(-1) == 1) ? x : contiguous(x);
  }
  if (batch_ok && (x.stride(-2) == 1 || r == 1) && x.stride(-1) >= std::max<int64_t>(r, 1) && r > 1) {
    trans = !trans;
    return transpose(x, -1, -2);
  }
  return contiguous(x);
}

// The 2-d or same-batch 3-d product; records its own backward.
Tensor mm(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  LOOM_CHECK(a.dtype() == b.dtype(), "matmul: dtypes ", dtype_name(a.dtype()), " and ",
             dtype_name(b.dtype()), " differ");
  const int64_t m = ta ? a.size(-1) : a.size(-2);
  const int64_t ka = ta ? a.size(-2) : a.size(-1);
  const int64_t kb = tb ? b.size(-1) : b.size(-2);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  LOOM_CHECK(ka == kb, "matmul: inner dims differ: op(a) is (", m, ", ", ka, "), op(b) is (", kb,
             ", ", n, ")");
  Shape out_shape = a.dim() == 3 ? Shape{a.size(0), m, n} : Shape{m, n};
  Tensor c = Tensor::empty(out_shape, a.dtype(), a.device());
  if (c.numel() > 0) {
    bool fa = ta, fb = tb;
    const Tensor ga = gemm_operand(a.detach(), fa);
    const Tensor gb = gemm_operand(b.detach(), fb);
    kernels::call_kernel<kernels::gemm_k>(ga, gb, c, fa, fb, 1.0, 0.0);
  }
  if (autograd::needs_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Tensor sa = need_b ? a.detach() : Tensor();
    Tensor sb = need_a ? b.detach() : Tensor();
    autograd::record_function("matmul", {a, b}, {&c}, [=](const std::vector<Tensor>& g) {
      const Tensor& d = g[0];
      Tensor da, db;
      if (need_a) da = ta ? mm(sb, d, tb, true) : mm(d, sb, false, !tb);
      if (need_b) db = tb ? mm(d, sa, true, ta) : mm(sa, d, !ta, false);
      return std::vector<Tensor>{da, db};
    });
  }
  return c;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  LOOM_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: operands must have at least 2 dims, got ",
             shape_str(a.shape()), " and ", shape_str(b.shape()));
  if (b.dim() == 2) {
    if (a.dim() == 2) return mm(a, b, trans_a, trans_b);
    LOOM_CHECK(!trans_a, "matmul: a (…, M, K) with a 2-d b cannot be transposed");
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    Tensor c = mm(reshape(a, {-1, a.size(-1)}), b, false, trans_b);
    out_shape.push_back(c.size(-1));
    return reshape(c, out_shape);
  }
  LOOM_CHECK(a.dim() == b.dim(), "matmul: batched operands must have equal rank, got ",
             shape_str(a.shape()), " and ", shape_str(b.shape()));
  for (int64_t d = 0; d + 2 < a.dim(); ++d) {
    LOOM_CHECK(a.size(d) == b.size(d), "matmul: batch dims differ: ", shape_str(a.shape()), " and ",
               shape_str(b.shape()));
  }
  if (a.dim() == 3) return mm(a, b, trans_a, trans_b);
  Shape lead(a.shape().begin(), a.shape().end() - 2);
  Tensor c = mm(reshape(a, {-1, a.size(-2), a.size(-1)}), reshape(b, {-1, b.size(-2), b.size(-1)}),
                trans_a, trans_b);
  lead.push_back(c.size(-2));
  lead.push_back(c.size(-1));
  return reshape(c, lead);
}

}  // namespace loom::ops
