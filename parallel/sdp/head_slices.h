// parallel/sdp/head_slices.h — the gradient-sync slices of the heads option's packed attention
// (forward masking, Note [SDP packed heads] in parallel/sdp/forward_masking.h; backward masking's
// trained part, Note [SDP backward-masked heads]): for each block and each slice of the heads
// cover that a worker holds, the pieces of the block's packed qkv weight (and bias) and proj
// weight that hold the slice's kv groups, with the slice's holders and a global id; and, for
// backward masking's frozen copies (held = false), the pieces of the slices it does not hold,
// under the holders' ids (the publication's). Pure: unit-testable without communication. The MLP's
// and the replicated parameters' slices are sdp_slices' (parallel/sdp/sdp_sync.h), which leaves the
// packed attention parameters to this list; the caller joins the two, giving this list an id base
// past the other's ids.
//
// Note [SDP head slices]: slice s of layer l of the heads cover is kv groups [b, e) of block l.
// With g query heads per group, head dim D, Q = U·g·D query rows and K = U·D rows each of k and
// v (U groups), the slice is held in
//   qkv.weight  three pieces along dim 0: q rows [b·g·D, e·g·D), k rows Q + [b·D, e·D) and
//               v rows Q + K + [b·D, e·D) (Note [Fused qkv layout]);
//   qkv.bias    (GPT-2) the same three pieces;
//   proj.weight one piece along dim 1: columns [b·g·D, e·g·D) (a strided view);
// the proj bias is whole and replicated (sdp_slices lists it). Each piece lies inside one run
// of the parameter's kAxisSdp placement (a slice is inside one owned range of groups, whose q,
// k and v rows are one run each), which gives its local offset. Pieces are numbered within a
// block in parameter order (qkv.weight's q, k, v; then qkv.bias's; then proj.weight's): piece
// p of P per block (P = 7 for GPT-2, 4 for Llama, the same on every worker since every worker
// has the same parameters), and
//   id = id_base + ((n_layer − 1 − l)·N + s)·P + p,
// so the last block's slices come first (backward finishes them first, Note [SDP overlapped
// sync]) and an id names the same piece on every holder. The ids lie in
// [id_base, id_base + head_slice_id_span(...)). The frozen copies (frozen_parameters(),
// parallel/sdp/backward_masking.h: the unheld groups' rows and columns, packed ascending, with
// their own kAxisSdp placement, the same global shapes) give the same pieces of the slices the
// worker does not hold: the same p (the frozen list has the same attention parameters in the
// same order), hence the holders' ids.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/sdp/assignment.h"
#include "parallel/sdp/sdp_sync.h"

namespace loom::parallel::sdp {

// Whether `parameter` is one of a block's attention parameters that the heads option packs (by
// its ParamRole, core/param_role.h: attn.qkv.weight, attn.qkv.bias, attn.proj.weight; not the
// proj bias, whole).
bool is_packed_head_parameter(const Tensor& parameter);

// The slices of worker `worker`'s packed attention parameters among `params` (its model's
// named_parameters(), built with the heads cover `heads`), in ascending id (Note [SDP head
// slices]); with held = false, of the slices it does not hold among `params` = its frozen
// copies (frozen_parameters()), each with its holders (not including `worker`). Errors name the
// parameter when a packed attention parameter is not packed over kAxisSdp (a model built without
// the heads option), is outside the cover's blocks, its block lacks the qkv or proj weight, or a
// piece is not inside one of its runs.
std::vector<SdpSliceSpec> head_slices(const NeuronAssignment& heads, int worker,
                                      const std::vector<std::pair<std::string, Tensor>>& params,
                                      int64_t id_base, bool held = true);

// n_layer·N·P: the number of ids head_slices may use from its base, the same on every worker.
int64_t head_slice_id_span(const NeuronAssignment& heads,
                           const std::vector<std::pair<std::string, Tensor>>& params);

}  // namespace loom::parallel::sdp
