// kernels/attention.h — causal scaled-dot-product attention kernels, flash-style: the forward
// keeps only per-row softmax statistics (lse) and the backward recomputes probabilities from
// them, so no backend ever stores a T×T matrix. Kernels allocate nothing they return, and
// their results do not depend on the thread count (or, on CUDA, on the launch order).
#pragma once

#include "kernels/registry.h"

// Note [Attention kernel contract]: the same signatures serve the CPU kernels and a CUDA
// flash kernel.
//   q    (B, Hq, T, D)   contiguous
//   k, v (B, Hkv, T, D)  contiguous; Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv)
//   out  (B, Hq, T, D)   contiguous, written (not accumulated)
//   lse  (B, Hq, T)      contiguous: lse_i = log Σ_{j≤i} exp(s_ij), s_ij = scale · q_i·k_j.
//                        Its dtype is q's for f32/f64 and f32 for 16-bit q.
//   doc_start (T) i32 contiguous on q's device, or undefined: packed documents (Note [Packed
//                        documents]). Shared by every batch row and head.
// Row i attends to columns j ≤ i (causal), and with doc_start only to doc_start[i] ≤ j ≤ i:
// the sums over j (lse's above, the backward's below) run over those columns alone. scale > 0
// is applied to the scores.
// Backward, from the saved q, k, v, out, lse and the incoming dout (B, Hq, T, D):
//   D_i = Σ_d dout_id · out_id          p_ij  = exp(s_ij − lse_i)
//   dv_j += Σ_i p_ij dout_i             dp_ij = dout_i · v_j
//   ds_ij = p_ij (dp_ij − D_i)
//   dq_i += scale Σ_j ds_ij k_j         dk_j += scale Σ_i ds_ij q_i
// dq, dk, dv have q's, k's and v's shapes, are contiguous and are ACCUMULATED into. The sums
// over query heads sharing a kv head (grouped-query) land in that kv head's dk, dv.
//
// Note [Packed documents]: SFT packing puts several documents in one row of the sequence
// (positions restart at 0 for each) and attention must never cross a document. doc_start[i] is
// the first key row i attends: its document's first token, so doc_start[0] = 0 and doc_start[i]
// ∈ {doc_start[i−1], i} (documents are contiguous; the documents' rule, check_documents). A
// sliding window of W tokens (Mistral's; Note [Sliding window] in layers/transformer.cpp) moves it
// to max(document start, i − W + 1). The kernels need only what both give — doc_start[0] = 0 and
// doc_start[i−1] ≤ doc_start[i] ≤ i (non-decreasing, never past the diagonal; check_doc_start) —
// and never ask where a document starts or ends. Undefined means the plain causal mask, with
// exactly today's results; an all-zero doc_start gives the same results (bit for bit on the CPU;
// on CUDA through the packed instantiations, never cuDNN). The kernels skip the masked work
// rather than compute and mask it: the CPU loops start at doc_start[i]; the CUDA kernels skip
// whole tiles outside [doc_start of a tile's first row, the tile's diagonal] (the first row has
// the tile's smallest doc_start) and mask elementwise only on the tiles where a row's first key
// falls; a backward walks, for a key tile, only the query tiles whose first row still sees its
// last key (a later row's doc_start is no smaller). The rule is checked on the host by
// ops::causal_attention and by the CPU kernels; the CUDA kernels trust it (checking would read
// the device). cuDNN's attention is never used with doc_start (Note [cuDNN attention]).

LOOM_DECLARE_KERNEL(attention_forward, void(const loom::Tensor& q, const loom::Tensor& k,
                                            const loom::Tensor& v, const loom::Tensor& doc_start,
                                            double scale, loom::Tensor& out, loom::Tensor& lse));
LOOM_DECLARE_KERNEL(attention_backward,
                    void(const loom::Tensor& q, const loom::Tensor& k, const loom::Tensor& v,
                         const loom::Tensor& doc_start, const loom::Tensor& out,
                         const loom::Tensor& lse, const loom::Tensor& dout, double scale,
                         loom::Tensor& dq, loom::Tensor& dk, loom::Tensor& dv));

namespace loom::kernels {

// Note [cuDNN attention]: on CUDA the attention kernels above are Loom's own flash kernels
// (kernels/cuda/attention*.cu) unless the calling thread holds a CudnnAttentionGuard, when the
// cases cuDNN's fused flash attention supports (cudnn_attention_handles: bf16/f16, T > 1, head
// size a multiple of 8 up to 128, 16-byte aligned buffers) run through cuDNN's graph API instead
// (kernels/cuda/attention_cudnn.cpp, one cached graph per shape); every other case still runs
// Loom's kernels, and so does every call with a doc_start (packed documents: cuDNN's graphs here
// take no per-token mask). Both keep the contract above: cuDNN's softmax statistics are the
// natural-log lse, so either backward accepts either forward's lse; cuDNN's gradients, which it
// writes, are added into dq, dk, dv. A cuDNN failure on a case it should handle is an error, never
// a silent fallback. The trainer sets the guard from `train.attention_kernel` (docs/config.md) for
// steps and evaluation, not for sampling (a new graph for every context length); like
// AllowTf32Guard the flag is thread_local and changed only by the guard. The CPU ignores it.
class CudnnAttentionGuard {
 public:
  explicit CudnnAttentionGuard(bool use = true);
  ~CudnnAttentionGuard();
  CudnnAttentionGuard(const CudnnAttentionGuard&) = delete;
  CudnnAttentionGuard& operator=(const CudnnAttentionGuard&) = delete;

 private:
  bool previous_;
};

// Checks doc_start against the kernels' contract for a sequence of t tokens (Note [Packed
// documents]): undefined passes; else it must be (t) i32, contiguous, and when it is on the host,
// start at 0 and never decrease nor pass the diagonal. `name` starts the message.
void check_doc_start(const Tensor& doc_start, int64_t t, const char* name);
// The same with the documents' rule on the host: doc_start[i] ∈ {doc_start[i−1], i} (what packed
// documents give; Transformer checks its input with it).
void check_documents(const Tensor& doc_start, int64_t t, const char* name);

// Whether this thread asked for cuDNN attention (Note [cuDNN attention]).
bool cudnn_attention_requested();

// Whether this build has the cuDNN attention path (a CUDA build that found cuDNN's C++
// frontend headers, tools/install_deps.sh).
bool cudnn_attention_built();

// Whether this process can use cuDNN's attention: the build has it and libcudnn.so.9 loads
// (train.attention_kernel: auto). When not, `why` (if given) says which of the two failed.
bool cudnn_attention_loadable(std::string* why = nullptr);

// Whether cuDNN's attention takes this dtype, sequence length (cuDNN refuses T = 1) and head
// size in this build (alignment is checked per call by the launcher).
bool cudnn_attention_handles(DType dtype, int64_t seq_len, int64_t head_dim);

// Builds the forward and backward graphs cuDNN's attention would run for q (B, Hq, T, D) and
// k, v (B, Hkv, T, D) on a GPU of compute capability `sm_version` (e.g. 90), and runs the cuDNN
// frontend's validation on them — no GPU needed. Returns "" when both are valid, else the
// frontend's message. Throws when the build has no cuDNN path or libcudnn cannot be loaded.
std::string cudnn_attention_graph_check(DType dtype, const Shape& q_shape, const Shape& kv_shape,
                                        int sm_version);

}  // namespace loom::kernels
