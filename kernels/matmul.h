// kernels/matmul.h — GEMM: c = alpha · op(a) · op(b) + beta · c, plain or batched.
#pragma once

#include "kernels/registry.h"

// a, b, c are 2-d, or 3-d with equal batch sizes. Each matrix's last dim has stride 1 and its
// rows stride(-2) apart (so transposed operands are passed as-is, with the flag). op(a) is
// (M, K), op(b) is (K, N), c is (M, N) and contiguous.
LOOM_DECLARE_KERNEL(gemm, void(const loom::Tensor& a, const loom::Tensor& b, loom::Tensor& c,
                               bool trans_a, bool trans_b, double alpha, double beta));

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

}  // namespace loom::kernels
