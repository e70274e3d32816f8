// kernels/cpu/matmul.cpp — CPU GEMM through OpenBLAS's CBLAS interface (chosen over Eigen by
// measurement: see docs/performance.md). Batched GEMMs loop over the batch; each call is
// multi-threaded by OpenBLAS (OpenMP build, sharing Loom's thread pool). The fused bias and
// bias+GELU forms are the reference for the CUDA epilogues: bias rows written first, then one
// GEMM with beta = 1, then the CPU gelu_forward kernel; the GELU backward form is one GEMM,
// then the CPU gelu_backward and sum_dim_forward kernels.
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "kernels/activation.h"
#include "kernels/copy.h"
#include "kernels/reduce.h"

namespace loom::kernels {

std::string cpu_blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

}  // namespace loom::kernels

namespace loom::kernels::cpu {
namespace {

template <typename T>
void gemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  }
}

void gemm_cpu(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, double alpha,
              double beta) {
  const bool batched = c.dim() == 3;
  const int64_t batch = batched ? c.size(0) : 1;
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  LOOM_CHECK(a.stride(-1) == 1 && b.stride(-1) == 1 && c.is_contiguous(),
             "gemm: operands need unit stride in their last dim");
  LOOM_DISPATCH_FLOAT(c.dtype(), "gemm", [&] {
    const scalar_t* pa = a.data<scalar_t>();
    const scalar_t* pb = b.data<scalar_t>();
    scalar_t* pc = c.data<scalar_t>();
    const int64_t sa = batched ? a.stride(0) : 0, sb = batched ? b.stride(0) : 0;
    for (int64_t i = 0; i < batch; ++i) {
      if (k == 0) {  // c = beta · c; with beta 0, c is not read (it may hold NaN)
        for (int64_t j = 0; j < m * n; ++j) {
          pc[i * m * n + j] =
              beta == 0.0 ? scalar_t(0) : pc[i * m * n + j] * static_cast<scalar_t>(beta);
        }
        continue;
      }
      gemm_one<scalar_t>(trans_a, trans_b, m, n, k, static_cast<scalar_t>(alpha), pa + i * sa,
                         a.stride(-2), pb + i * sb, b.stride(-2), static_cast<scalar_t>(beta),
                         pc + i * m * n, n);
    }
  });
}

// c (M, N) = op(a)·op(b) + bias (N): every row of c set to bias, then c += op(a)·op(b).
void gemm_bias_cpu(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c, bool trans_a,
                   bool trans_b) {
  LOOM_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "gemm_bias: operands must be 2-d");
  const int64_t m = c.size(0), n = c.size(1);
  LOOM_CHECK(
      bias.dim() == 1 && bias.size(0) == n && bias.is_contiguous() && bias.dtype() == c.dtype(),
      "gemm_bias: bias must be contiguous (", n, ") ", dtype_name(c.dtype()), ", got ",
      shape_str(bias.shape()), " ", dtype_name(bias.dtype()));
  LOOM_CHECK(c.is_contiguous(), "gemm_bias: c must be contiguous");
  LOOM_DISPATCH_FLOAT(c.dtype(), "gemm_bias", [&] {
    const scalar_t* pb = bias.data<scalar_t>();
    scalar_t* pc = c.data<scalar_t>();
    for (int64_t i = 0; i < m; ++i) std::copy(pb, pb + n, pc + i * n);
  });
  gemm_cpu(a, b, c, trans_a, trans_b, 1.0, 1.0);
}

void gemm_bias_gelu_cpu(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& pre,
                        Tensor& c, bool trans_a, bool trans_b) {
  LOOM_CHECK(pre.shape() == c.shape() && pre.dtype() == c.dtype() && pre.is_contiguous(),
             "gemm_bias_gelu: pre must be contiguous like c ", shape_str(c.shape()));
  gemm_bias_cpu(a, b, bias, pre, trans_a, trans_b);
  find_kernel<gelu_forward_k>(DeviceType::kCpu)(pre, c);
}

void gemm_dgelu_bgrad_cpu(const Tensor& a, const Tensor& b, const Tensor& pre, Tensor& dpre,
                          Tensor& dbias, bool trans_a, bool trans_b) {
  LOOM_CHECK(a.dim() == 2 && b.dim() == 2 && dpre.dim() == 2,
             "gemm_dgelu_bgrad: operands must be 2-d");
  LOOM_CHECK(pre.shape() == dpre.shape() && pre.dtype() == dpre.dtype() && pre.is_contiguous() &&
                 dpre.is_contiguous(),
             "gemm_dgelu_bgrad: pre and dpre must be contiguous ", shape_str(dpre.shape()),
             " of one dtype");
  LOOM_CHECK(dbias.dim() == 1 && dbias.size(0) == dpre.size(1) && dbias.is_contiguous() &&
                 dbias.dtype() == dpre.dtype(),
             "gemm_dgelu_bgrad: dbias must be contiguous (", dpre.size(1), ") ",
             dtype_name(dpre.dtype()), ", got ", shape_str(dbias.shape()), " ",
             dtype_name(dbias.dtype()));
  Tensor dy = Tensor::empty(dpre.shape(), dpre.dtype());
  gemm_cpu(a, b, dy, trans_a, trans_b, 1.0, 0.0);
  find_kernel<fill_k>(DeviceType::kCpu)(dpre, 0.0);
  find_kernel<gelu_backward_k>(DeviceType::kCpu)(pre, dy, dpre);
  find_kernel<sum_dim_forward_k>(DeviceType::kCpu)(dpre, 1, dpre.size(0), dpre.size(1), dbias);
}

}  // namespace

LOOM_REGISTER_KERNEL(gemm, kCpu, gemm_cpu);
LOOM_REGISTER_KERNEL(gemm_bias, kCpu, gemm_bias_cpu);
LOOM_REGISTER_KERNEL(gemm_bias_gelu, kCpu, gemm_bias_gelu_cpu);
LOOM_REGISTER_KERNEL(gemm_dgelu_bgrad, kCpu, gemm_dgelu_bgrad_cpu);

}  // namespace loom::kernels::cpu
