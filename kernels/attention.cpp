// kernels/attention.cpp — the thread's choice of attention implementation on CUDA (Note [cuDNN
// attention] in kernels/attention.h): a thread_local flag changed only by CudnnAttentionGuard,
// and what this build's cuDNN path takes; and the doc_start check every backend and the op share
// (Note [Packed documents]). Holds no other state and no kernel.
#include "kernels/attention.h"

namespace loom::kernels {
namespace {
thread_local bool t_use_cudnn = false;
}  // namespace

CudnnAttentionGuard::CudnnAttentionGuard(bool use) : previous_(t_use_cudnn) { t_use_cudnn = use; }
CudnnAttentionGuard::~CudnnAttentionGuard() { t_use_cudnn = previous_; }

namespace {

// Shape and dtype; the rows on the host (or null on a device, where the rule is not checked).
const int32_t* checked_rows(const Tensor& doc_start, int64_t t, const char* name) {
  if (!doc_start.defined()) return nullptr;
  LOOM_CHECK(doc_start.dim() == 1 && doc_start.size(0) == t && doc_start.dtype() == DType::kI32 &&
                 doc_start.is_contiguous(),
             name, ": doc_start must be contiguous (", t, ") i32, got ",
             shape_str(doc_start.shape()), " ", dtype_name(doc_start.dtype()));
  return doc_start.device().is_cpu() ? doc_start.data<int32_t>() : nullptr;
}

}  // namespace

void check_doc_start(const Tensor& doc_start, int64_t t, const char* name) {
  const int32_t* ds = checked_rows(doc_start, t, name);
  if (ds == nullptr) return;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t prev = i == 0 ? 0 : ds[i - 1];
    LOOM_CHECK(ds[i] >= prev && ds[i] <= i, name, ": doc_start[", i, "] = ", ds[i],
               " must lie in [doc_start[i-1] = ", prev, ", ", i,
               "]: each row's first key, never decreasing (doc_start[0] = 0)");
  }
}

void check_documents(const Tensor& doc_start, int64_t t, const char* name) {
  const int32_t* ds = checked_rows(doc_start, t, name);
  if (ds == nullptr) return;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t prev = i == 0 ? 0 : ds[i - 1];
    LOOM_CHECK(ds[i] == prev || ds[i] == i, name, ": doc_start[", i, "] = ", ds[i],
               " must be doc_start[i-1] (", prev, ", same document) or ", i,
               " (a document starts); documents are contiguous and doc_start[0] = 0");
  }
}

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

bool cudnn_attention_loadable(std::string* why) {
  if (why != nullptr) *why = "this build has no cuDNN attention";
  return false;
}
#endif  // else kernels/cuda/attention_cudnn.cpp defines them

}  // namespace loom::kernels
