// parallel/mesh_layers.h — mesh_layer_context: the LayerContext (layers/build_context.h) of
// one rank over its tensor-parallel and context-parallel groups. Its capabilities are the
// parallel/tp layers (column, row and vocab-parallel, with sequence parallelism's region ops),
// ring, Ulysses or hybrid attention over cp (parallel/cp), the vocab-parallel, context-averaged
// loss, and the layout of this rank's tokens (its cp part) and activation rows (their TP chunk
// under sequence parallelism). The context owns everything it made; the communicators (usually a
// ParallelContext's tp() and cp(), and for hybrid attention its cp_ulysses and cp_ring groups)
// must outlive every model built with it.
//
// Note [Gradients of replicated parameters]: parameters that every TP rank holds whole (norm
// weights and biases, a row-parallel layer's bias, wpe) get identical gradients on every TP
// rank without sequence parallelism; with it each rank's activations are a sequence chunk, so
// those parameters are used through the linear factory's replicated_param (copy_to_region: the
// gradient is summed over the TP group in backward) and still arrive complete. Under context
// parallelism every parameter gets only this rank's tokens' share: those are summed over the
// cp group together with data parallelism's reduction (the model never reduces over cp itself).
#pragma once

#include "layers/build_context.h"
#include "parallel/comm/communicator.h"
#include "parallel/tp/layers.h"

namespace loom::parallel {

// How attention spans the cp group: ring attention (parallel/cp/ring_attention.h), the
// Ulysses head split (parallel/cp/ulysses.h), or both (parallel/cp/hybrid.h).
enum class CpAttention { kRing, kUlysses, kHybrid };

// The capabilities over tp and cp. `spans` (empty: none) receives the TP layers' GEMM spans
// (parallel/tp/layers.h), for the profiler. kHybrid also takes the cp group's split,
// cp_ulysses × cp_ring (Note [Hybrid context parallelism] in parallel/cp/hybrid.h).
LayerContext mesh_layer_context(Communicator& tp, Communicator& cp, bool sequence_parallel,
                                tp::SpanSink spans = {},
                                CpAttention cp_attention = CpAttention::kRing,
                                Communicator* cp_ulysses = nullptr,
                                Communicator* cp_ring = nullptr);

}  // namespace loom::parallel
