// core/ops/norm.cpp — layer_norm/rms_norm/residual_layer_norm front-ends. The forward kernels also
// write the row statistics (mean, rstd: (N) in kernels::norm_stat_dtype(x's dtype)), which
// backward reuses instead of recomputing.
#include "core/ops/norm.h"

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/norm.h"

namespace loom::ops {
namespace {

// Checks x (…, C) against a (C) parameter of the same dtype and device.
void check_param(const char* op, const char* what, const Tensor& x, const Tensor& p) {
  LOOM_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), op, ": ", what, " has shape ",
             shape_str(p.shape()), ", expected (", x.size(-1), ") for input ",
             shape_str(x.shape()));
  LOOM_CHECK(p.dtype() == x.dtype(), op, ": ", what, " dtype ", dtype_name(p.dtype()),
             " differs from the input's ", dtype_name(x.dtype()));
}

int64_t row_count(const char* op, const Tensor& x) {
  LOOM_CHECK(x.dim() >= 1 && x.size(-1) > 0, op, ": input ", shape_str(x.shape()),
             " needs a non-empty last dimension");
  return x.numel() / x.size(-1);
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t rows = row_count("layer_norm", x);
  check_param("layer_norm", "weight", x, weight);
  if (bias.defined()) check_param("layer_norm", "bias", x, bias);
  const Tensor xc = contiguous(x.detach()), wc = contiguous(weight.detach());
  const Tensor bc = bias.defined() ? contiguous(bias.detach()) : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const DType sd = kernels::norm_stat_dtype(x.dtype());
  Tensor mean = Tensor::empty({rows}, sd, x.device());
  Tensor rstd = Tensor::empty({rows}, sd, x.device());
  if (rows > 0) kernels::call_kernel<kernels::layer_norm_forward_k>(xc, wc, bc, eps, y, mean, rstd);
  if (autograd::needs_grad({&x, &weight, &bias})) {
    autograd::record_function("layer_norm", {x, weight, bias}, {&y},
                              [xc, wc, bc, mean, rstd](const std::vector<Tensor>& g) {
                                Tensor dx = Tensor::zeros_like(xc), dw = Tensor::zeros_like(wc);
                                Tensor db = bc.defined() ? Tensor::zeros_like(bc) : Tensor();
                                if (g[0].defined() && dx.numel() > 0) {
                                  kernels::call_kernel<kernels::layer_norm_backward_k>(
                                      contiguous(g[0]), xc, wc, mean, rstd, dx, dw, db);
                                }
                                return std::vector<Tensor>{dx, dw, db};
                              });
  }
  return y;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const int64_t rows = row_count("rms_norm", x);
  check_param("rms_norm", "weight", x, weight);
  const Tensor xc = contiguous(x.detach()), wc = contiguous(weight.detach());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, kernels::norm_stat_dtype(x.dtype()), x.device());
  if (rows > 0) kernels::call_kernel<kernels::rms_norm_forward_k>(xc, wc, eps, y, rstd);
  if (autograd::needs_grad({&x, &weight})) {
    autograd::record_function("rms_norm", {x, weight}, {&y},
                              [xc, wc, rstd](const std::vector<Tensor>& g) {
                                Tensor dx = Tensor::zeros_like(xc), dw = Tensor::zeros_like(wc);
                                if (g[0].defined() && dx.numel() > 0) {
                                  kernels::call_kernel<kernels::rms_norm_backward_k>(
                                      contiguous(g[0]), xc, wc, rstd, dx, dw);
                                }
                                return std::vector<Tensor>{dx, dw};
                              });
  }
  return y;
}

ResidualLayerNorm residual_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight,
                                      const Tensor& bias, double eps) {
  const int64_t rows = row_count("residual_layer_norm", x);
  LOOM_CHECK(r.shape() == x.shape() && r.dtype() == x.dtype() && r.device() == x.device(),
             "residual_layer_norm: residual ", shape_str(r.shape()), " ", dtype_name(r.dtype()),
             " must match the input ", shape_str(x.shape()), " ", dtype_name(x.dtype()));
  check_param("residual_layer_norm", "weight", x, weight);
  if (bias.defined()) check_param("residual_layer_norm", "bias", x, bias);
  const Tensor xc = contiguous(x.detach()), rc = contiguous(r.detach());
  const Tensor wc = contiguous(weight.detach());
  const Tensor bc = bias.defined() ? contiguous(bias.detach()) : Tensor();
  ResidualLayerNorm out{Tensor::empty(x.shape(), x.dtype(), x.device()),
                        Tensor::empty(x.shape(), x.dtype(), x.device())};
  const DType sd = kernels::norm_stat_dtype(x.dtype());
  Tensor mean = Tensor::empty({rows}, sd, x.device());
  Tensor rstd = Tensor::empty({rows}, sd, x.device());
  if (rows > 0) {
    kernels::call_kernel<kernels::residual_layer_norm_forward_k>(xc, rc, wc, bc, eps, out.sum,
                                                                 out.normalized, mean, rstd);
  }
  if (autograd::needs_grad({&x, &r, &weight, &bias})) {
    // The saved sum is a detached alias of the output (no reference cycle through the node).
    const Tensor ss = out.sum.detach();
    autograd::record_function("residual_layer_norm", {x, r, weight, bias},
                              {&out.sum, &out.normalized},
                              [ss, wc, bc, mean, rstd](const std::vector<Tensor>& g) {
                                // g[0]: gradient of the sum, g[1]: of the normalized output; x and
                                // r get the same one.
                                Tensor dw = Tensor::zeros_like(wc);
                                Tensor db = bc.defined() ? Tensor::zeros_like(bc) : Tensor();
                                Tensor dx = g[0];
                                if (g[1].defined()) {
                                  dx = Tensor::zeros_like(ss);
                                  if (dx.numel() > 0) {
                                    const Tensor ds = g[0].defined() ? contiguous(g[0]) : Tensor();
                                    kernels::call_kernel<kernels::residual_layer_norm_backward_k>(
                                        contiguous(g[1]), ds, ss, wc, mean, rstd, dx, dw, db);
                                  }
                                }
                                return std::vector<Tensor>{dx, dx, dw, db};
                              });
  }
  return out;
}

}  // namespace loom::ops
