// kernels/attention.cpp — the thread's choice of attention implementation on CUDA (Note [cuDNN
// attention] in kernels/attention.h): a thread_local flag changed only by CudnnAttentionGuard,
// and what this build's cuDNN path takes. Holds no other state and no kernel.
#include "kernels/attention.h"

namespace loom::kernels {
namespace {
thread_local bool t_use_cudnn = false;
}  // namespace

CudnnAttentionGuard::CudnnAttentionGuard(bool use) : previous_(t_use_cudnn) { t_use_cudnn = use; }
CudnnAttentionGuard::~CudnnAttentionGuard() { t_use_cudnn = previous_; }

bool cudnn_attention_requested() { return t_use_cudnn; }

bool cudnn_attention_built() { return LOOM_HAS_CUDNN_FRONTEND != 0; }

bool cudnn_attention_handles(DType dtype, int64_t seq_len, int64_t head_dim) {
  return cudnn_attention_built() && (dtype == DType::kBF16 || dtype == DType::kF16) &&
         seq_len > 1 && head_dim > 0 && head_dim % 8 == 0 && head_dim <= 128;
}

#if !LOOM_HAS_CUDNN_FRONTEND
std::string cudnn_attention_graph_check(DType, const Shape&, const Shape&, int) {
  LOOM_FAIL("cudnn_attention_graph_check: this build has no cuDNN attention");
}
#endif  // else kernels/cuda/attention_cudnn.cpp defines it

}  // namespace loom::kernels
