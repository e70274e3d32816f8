// kernels/matmul.h — GEMM: c = alpha · op(a) · op(b) + beta · c, plain or batched; the fused
// bias and bias+GELU forms used by Linear layers; the TF32 switch read by the CUDA GEMM; and which
// OpenBLAS kernel set the CPU GEMM runs on.
#pragma once

#include <string>

#include "kernels/registry.h"

// a, b, c are 2-d, or 3-d with equal batch sizes. Each matrix's last dim has stride 1 and its
// rows stride(-2) apart (so transposed operands are passed as-is, with the flag). op(a) is
// (M, K), op(b) is (K, N), c is (M, N) and contiguous. a and b share a dtype; the CPU takes
// f32/f64 with c of the same dtype; CUDA also takes bf16/f16 a and b (f32 accumulation) with c
// bf16/f16 like them or f32. With beta == 0, c is not read (it may hold garbage or NaN).
LOOM_DECLARE_KERNEL(gemm, void(const loom::Tensor& a, const loom::Tensor& b, loom::Tensor& c,
                               bool trans_a, bool trans_b, double alpha, double beta));

// Fused Linear forward, 2-d only, operands as for gemm:
//   c (M, N) = op(a) · op(b) + bias   (bias (N) contiguous, broadcast over the M rows)
// c is overwritten (never read); bias has c's dtype.
LOOM_DECLARE_KERNEL(gemm_bias,
                    void(const loom::Tensor& a, const loom::Tensor& b, const loom::Tensor& bias,
                         loom::Tensor& c, bool trans_a, bool trans_b));
// Fused Linear + GELU (tanh form, as kernels/activation.h) forward, 2-d only:
//   pre (M, N) = op(a) · op(b) + bias;   c (M, N) = gelu(pre)
// pre is kept for the backward (dpre = dc · gelu'(pre)); both contiguous, overwritten, of the
// bias's dtype.
LOOM_DECLARE_KERNEL(gemm_bias_gelu,
                    void(const loom::Tensor& a, const loom::Tensor& b, const loom::Tensor& bias,
                         loom::Tensor& pre, loom::Tensor& c, bool trans_a, bool trans_b));
// The backward of gemm_bias_gelu fused into the GEMM that brings its output's gradient (the
// next Linear's input gradient), 2-d only, operands as for gemm:
//   dpre (M, N) = (op(a) · op(b)) ⊙ gelu'(pre);   dbias (N) = Σ over the M rows of dpre
// pre (M, N) is gemm_bias_gelu's saved pre-activation. dpre and dbias are overwritten (never
// read); pre, dpre, dbias contiguous, of a's dtype. CUDA: cuBLASLt's DGELU_BGRAD epilogue for
// bf16/f16 when the library has an algorithm, else GEMM, gelu_backward and a column sum.
LOOM_DECLARE_KERNEL(gemm_dgelu_bgrad,
                    void(const loom::Tensor& a, const loom::Tensor& b, const loom::Tensor& pre,
                         loom::Tensor& dpre, loom::Tensor& dbias, bool trans_a, bool trans_b));

namespace loom::kernels {

// Note [TF32]: f32 GEMMs on CUDA run in exact FP32 (CUBLAS_COMPUTE_32F) unless TF32 is allowed
// on the calling thread, when they use CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded to a
// 10-bit mantissa, f32 accumulation: about 1e-3 relative error, several times faster). The
// flag is thread_local, off by default, and set only by this scoped guard, e.g. by the trainer
// around a step when the config enables TF32:
//     { kernels::AllowTf32Guard tf32(cfg.allow_tf32); model.forward(...); ... }
// Other dtypes and the CPU ignore it.
class AllowTf32Guard {
 public:
  explicit AllowTf32Guard(bool allow = true);
  ~AllowTf32Guard();
  AllowTf32Guard(const AllowTf32Guard&) = delete;
  AllowTf32Guard& operator=(const AllowTf32Guard&) = delete;

 private:
  bool previous_;
};

// Whether f32 GEMMs issued by this thread may use TF32 (Note [TF32]).
bool tf32_allowed();

// The kernel set OpenBLAS runs the CPU GEMMs on in this process (openblas_get_corename(), e.g.
// "Cooperlake" or "Haswell"). OpenBLAS picks it from the CPU when it loads, unless the
// environment forces one with OPENBLAS_CORETYPE; on an AVX-512 CPU an AVX2 set (Haswell, Zen)
// runs SGEMM at about half speed, so the trainer's start line and the CPU benchmarks print it
// (docs/performance.md, "Where the CPU figures come from").
std::string cpu_blas_core();

}  // namespace loom::kernels
