// core/ops/matmul.cpp — matmul front-end. The backward of C = op(A)·op(B) is, per flag:
//   dA = dC·op(B)ᵀ  (or op(B)·dCᵀ when A was transposed)
//   dB = op(A)ᵀ·dC  (or dCᵀ·op(A) when B was transposed)
// each expressed as another matmul call, so no transpose is ever materialised.
// linear / linear_gelu fold x to (R, in) and call the fused kernels; their backward is
//   dpre = dy (linear) or dy·gelu'(pre) (linear_gelu);  dx = dpre·w;  dw = dpreᵀ·x;
//   dbias = Σ_rows dpre.
// gelu_mlp chains the two with h = gelu(pre); its backward starts with
//   dpre, db_fc = gemm_dgelu_bgrad(dy, w_proj, pre);  dw_proj = dyᵀ·h;  db_proj = Σ_rows dy,
// with h recomputed from pre (one element-wise pass) instead of saved, as llm.c does.
#include "core/ops/matmul.h"

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "kernels/activation.h"
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
  if (batch_ok && (x.stride(-2) == 1 || r == 1) && x.stride(-1) >= std::max<int64_t>(r, 1) &&
      r > 1) {
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
  const Shape out_shape = a.dim() == 3 ? Shape{a.size(0), m, n} : Shape{m, n};
  // Note [Selective recompute] in core/checkpoint.h: a kept product is not computed again.
  Tensor c = kept_or_computed(KeptOp::kMatmul, [&] {
    Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
    if (out.numel() > 0) {
      bool fa = ta, fb = tb;
      const Tensor ga = gemm_operand(a.detach(), fa);
      const Tensor gb = gemm_operand(b.detach(), fb);
      kernels::call_kernel<kernels::gemm_k>(ga, gb, out, fa, fb, 1.0, 0.0);
    }
    return std::vector<Tensor>{out};
  })[0];
  if (autograd::needs_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Tensor sa = need_b ? a.detach() : Tensor();
    Tensor sb = need_a ? b.detach() : Tensor();
    // Partial (Note [Split backward] in core/autograd.h): either product alone.
    autograd::record_partial_function(
        "matmul", {a, b}, {&c}, [=](const std::vector<Tensor>& g, const std::vector<bool>& want) {
          const Tensor& d = g[0];
          Tensor da, db;
          if (need_a && want[0]) da = ta ? mm(sb, d, tb, true) : mm(d, sb, false, !tb);
          if (need_b && want[1]) db = tb ? mm(d, sa, true, ta) : mm(sa, d, !ta, false);
          return std::vector<Tensor>{da, db};
        });
  }
  return c;
}

// Checks the Linear operands; returns x folded to a contiguous (R, in).
Tensor linear_input(const char* name, const Tensor& x, const Tensor& w, const Tensor& bias) {
  LOOM_CHECK(w.dim() == 2, name, ": weight must be (out, in), got ", shape_str(w.shape()));
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), name, ": input ", shape_str(x.shape()),
             " does not end in in_features ", w.size(1));
  LOOM_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), name, ": bias must be (", w.size(0),
             "), got ", shape_str(bias.shape()));
  LOOM_CHECK(x.dtype() == w.dtype() && bias.dtype() == w.dtype(), name, ": dtypes ",
             dtype_name(x.dtype()), ", ", dtype_name(w.dtype()), " and ", dtype_name(bias.dtype()),
             " differ");
  return contiguous(reshape(x.detach(), {-1, w.size(1)}));
}

// (…, out) for x (…, in).
Shape linear_shape(const Tensor& x, const Tensor& w) {
  Shape out(x.shape().begin(), x.shape().end() - 1);
  out.push_back(w.size(0));
  return out;
}

// Records the shared backward of linear / linear_gelu. `pre` is defined for linear_gelu: the
// incoming gradient is then multiplied by gelu'(pre) first. y is the (R, out) output.
void record_linear(const char* name, const Tensor& x, const Tensor& w, const Tensor& bias,
                   const Tensor& x2, const Tensor& wc, const Tensor& pre, Tensor& y) {
  if (!autograd::needs_grad({&x, &w, &bias})) return;
  const bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_b = bias.requires_grad();
  const Shape x_shape = x.shape();
  const Tensor sx = need_w ? x2 : Tensor();
  const Tensor sw = need_x ? wc : Tensor();
  // Partial (Note [Split backward] in core/autograd.h): dx alone, or dw and db alone (gelu'
  // is applied again for the second call: elementwise, the same values).
  autograd::record_partial_function(
      name, {x, w, bias}, {&y}, [=](const std::vector<Tensor>& g, const std::vector<bool>& want) {
        Tensor d = contiguous(reshape(g[0], {-1, wc.size(0)}));
        if (pre.defined()) {
          Tensor dpre = Tensor::zeros_like(pre);
          if (dpre.numel() > 0) kernels::call_kernel<kernels::gelu_backward_k>(pre, d, dpre);
          d = dpre;
        }
        Tensor dx, dw, db;
        if (need_x && want[0]) dx = reshape(mm(d, sw, false, false), x_shape);
        if (need_w && want[1]) dw = mm(d, sx, true, false);
        if (need_b && want[2]) db = sum(d, 0);
        return std::vector<Tensor>{dx, dw, db};
      });
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (!bias.defined()) return matmul(x, w, false, true);
  const Tensor x2 = linear_input("linear", x, w, bias);
  const Tensor wc = contiguous(w.detach());
  Tensor y2 = kept_or_computed(KeptOp::kMatmul, [&] {
    Tensor y = Tensor::empty({x2.size(0), w.size(0)}, x.dtype(), x.device());
    if (y.numel() > 0)
      kernels::call_kernel<kernels::gemm_bias_k>(x2, wc, contiguous(bias.detach()), y, false, true);
    return std::vector<Tensor>{y};
  })[0];
  record_linear("linear", x, w, bias, x2, wc, Tensor(), y2);
  return reshape(y2, linear_shape(x, w));
}

Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  LOOM_CHECK(bias.defined(), "linear_gelu: bias is required");
  const Tensor x2 = linear_input("linear_gelu", x, w, bias);
  const Tensor wc = contiguous(w.detach());
  std::vector<Tensor> r = kept_or_computed(KeptOp::kMatmul, [&] {
    Tensor p = Tensor::empty({x2.size(0), w.size(0)}, x.dtype(), x.device());
    Tensor y = Tensor::empty({x2.size(0), w.size(0)}, x.dtype(), x.device());
    if (y.numel() > 0) {
      kernels::call_kernel<kernels::gemm_bias_gelu_k>(x2, wc, contiguous(bias.detach()), p, y,
                                                      false, true);
    }
    return std::vector<Tensor>{p, y};
  });
  const Tensor pre = r[0];
  Tensor y2 = r[1];
  record_linear("linear_gelu", x, w, bias, x2, wc, pre, y2);
  return reshape(y2, linear_shape(x, w));
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj,
                const Tensor& b_proj) {
  LOOM_CHECK(b_fc.defined() && b_proj.defined(), "gelu_mlp: both biases are required");
  const Tensor x2 = linear_input("gelu_mlp", x, w_fc, b_fc);
  LOOM_CHECK(w_proj.dim() == 2 && w_proj.size(1) == w_fc.size(0) && w_proj.size(0) == w_fc.size(1),
             "gelu_mlp: w_proj must be (", w_fc.size(1), ", ", w_fc.size(0), "), got ",
             shape_str(w_proj.shape()));
  LOOM_CHECK(b_proj.dim() == 1 && b_proj.size(0) == w_proj.size(0), "gelu_mlp: b_proj must be (",
             w_proj.size(0), "), got ", shape_str(b_proj.shape()));
  LOOM_CHECK(w_proj.dtype() == x.dtype() && b_proj.dtype() == x.dtype(), "gelu_mlp: dtypes differ");
  const Tensor w1 = contiguous(w_fc.detach()), w2 = contiguous(w_proj.detach());
  const int64_t rows = x2.size(0), hidden = w1.size(0), dim = w2.size(0);
  std::vector<Tensor> r = kept_or_computed(KeptOp::kMatmul, [&] {
    Tensor p = Tensor::empty({rows, hidden}, x.dtype(), x.device());
    Tensor y = Tensor::empty({rows, dim}, x.dtype(), x.device());
    Tensor h = Tensor::empty({rows, hidden}, x.dtype(), x.device());  // freed after the forward
    if (p.numel() > 0) {
      kernels::call_kernel<kernels::gemm_bias_gelu_k>(x2, w1, contiguous(b_fc.detach()), p, h,
                                                      false, true);
    }
    if (y.numel() > 0)
      kernels::call_kernel<kernels::gemm_bias_k>(h, w2, contiguous(b_proj.detach()), y, false,
                                                 true);
    return std::vector<Tensor>{p, y};
  });
  const Tensor pre = r[0];
  Tensor y2 = r[1];
  if (autograd::needs_grad({&x, &w_fc, &b_fc, &w_proj, &b_proj})) {
    const bool need_x = x.requires_grad(), need_w1 = w_fc.requires_grad(),
               need_b1 = b_fc.requires_grad();
    const bool need_w2 = w_proj.requires_grad(), need_b2 = b_proj.requires_grad();
    const bool need_pre = need_x || need_w1 || need_b1;
    const Shape x_shape = x.shape();
    // Partial (Note [Split backward] in core/autograd.h): the gradient of the hidden
    // pre-activation (and b_fc's, which the same kernel writes) is computed by the first call
    // that needs it and kept for the second.
    struct Kept {
      Tensor dpre, db1;
    };
    auto kept = std::make_shared<Kept>();
    autograd::record_partial_function(
        "gelu_mlp", {x, w_fc, b_fc, w_proj, b_proj}, {&y2},
        [=](const std::vector<Tensor>& g, const std::vector<bool>& want) {
          const Tensor d = contiguous(reshape(g[0], {-1, dim}));
          Tensor dx, dw1, db1, dw2, db2;
          const bool now_x = need_x && want[0], now_w1 = need_w1 && want[1],
                     now_b1 = need_b1 && want[2];
          if (need_pre && (now_x || now_w1 || now_b1)) {
            Tensor dpre = kept->dpre, dbias = kept->db1;
            if (!dpre.defined()) {
              dpre = Tensor::empty({rows, hidden}, d.dtype(), d.device());
              if (dpre.numel() > 0) {  // the kernel writes db1 whole
                dbias = Tensor::empty({hidden}, d.dtype(), d.device());
                kernels::call_kernel<kernels::gemm_dgelu_bgrad_k>(d, w2, pre, dpre, dbias, false,
                                                                  false);
              } else {
                dbias = Tensor::zeros({hidden}, d.dtype(), d.device());
              }
            }
            if (now_x) dx = reshape(mm(dpre, w1, false, false), x_shape);
            if (now_w1) dw1 = mm(dpre, x2, true, false);
            if (now_b1) db1 = dbias;
            // Kept only for a second call that needs it; else freed here, before h below.
            const bool later =
                (need_x && !want[0]) || (need_w1 && !want[1]) || (need_b1 && !want[2]);
            kept->dpre = later ? dpre : Tensor();
            kept->db1 = later ? dbias : Tensor();
          }
          if (need_w2 && want[3]) {  // gelu(pre) again rather than kept: (R, H) less memory
            Tensor h = Tensor::empty({rows, hidden}, d.dtype(), d.device());
            if (h.numel() > 0) kernels::call_kernel<kernels::gelu_forward_k>(pre, h);
            dw2 = mm(d, h, true, false);
          }
          if (need_b2 && want[4]) db2 = sum(d, 0);
          return std::vector<Tensor>{dx, dw1, db1, dw2, db2};
        });
  }
  return reshape(y2, linear_shape(x, w2));
}

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
