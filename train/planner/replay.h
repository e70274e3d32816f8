// train/planner/replay.h — the byte counter the memory planner replays a step on (Note [Memory
// timeline] in train/planner/memory.h) and the replay of one transformer's forward and backward:
// embeddings, blocks (GPT-2 and Llama, optionally checkpointed), final norm, head and loss.
// Sizes are this rank's (tensor parallelism divides heads, hidden and vocabulary).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::planner {

// Allocations and frees by handle; current and peak bytes, and where the peak fell.
class ByteTimeline {
 public:
  using Id = int64_t;
  Id alloc(int64_t bytes);
  // Another handle on `id`'s storage (a second owner of one tensor's bytes, as a selective
  // region's tape shares its kept results): the bytes are freed with the storage's last handle.
  Id share(Id id);
  void free(Id id);  // freeing a handle twice is an error of the replay (0-byte aliases are fine)
  // An op's result of `bytes` takes `id`'s place: allocated while the old one is alive, which is
  // then freed (a bias added, a cast, a copy that replaces its input).
  void replace(Id& id, int64_t bytes);
  void set_phase(std::string phase) { phase_ = std::move(phase); }
  // Said before every phase in peak_at() ("mb 2, chunk 0: "), e.g. by a pipeline's replay.
  void set_context(std::string context) { context_ = std::move(context); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }
  const std::string& peak_at() const { return peak_at_; }

 private:
  struct Storage {
    int64_t bytes = 0;
    int handles = 0;
  };
  std::map<Id, Id> live_;  // a handle → its storage (named by the handle that allocated it)
  std::map<Id, Storage> storage_;
  Id next_ = 1;
  int64_t current_ = 0, peak_ = 0;
  std::string phase_, context_, peak_at_;
};

// The unit hooks' side of the step (ZeRO-3: Note [Parameter units] in layers/transformer.h,
// Note [ZeRO-3] in parallel/dp/data_parallel.h), told where the model brackets each unit: unit
// 0 the embeddings (re-entered by a tied head), 1 + i block i, n_layer + 1 the final norm and
// head. The replay calls them at the same points of the step as the model calls its hooks.
class UnitEvents {
 public:
  virtual ~UnitEvents() = default;
  virtual void before_forward(int unit) = 0;
  virtual void after_forward(int unit) = 0;
  virtual void before_backward(int unit) = 0;  // the unit's backward identity runs
  virtual void gradients_ready(int unit) = 0;  // its last parameter gradient has landed
};

// The shapes one rank's replay needs, in elements, and the byte sizes of its dtypes.
struct ReplayShape {
  bool llama = false;
  bool tied = true;  // the head reads wte (gpt2)
  bool checkpointing = false;
  // model.recompute: selective — the KeptOps bits (core/checkpoint.h) of model.recompute_save
  // whose results a checkpointed block keeps (Note [Selective recompute] there); 0: full.
  uint32_t keep = 0;
  int64_t B = 1, T = 1;              // rows of a micro-batch and this rank's tokens per row
  int64_t C = 0;                     // n_embd
  int64_t q = 0, kv = 0, heads = 0;  // this rank's query and kv features, query heads
  int64_t F = 0;                     // this rank's MLP hidden
  int64_t V = 0;                     // this rank's (padded) vocabulary rows
  int64_t max_positions = 0;         // gpt2: wpe's rows (model.max_seq_len)
  int64_t e = 4;                     // bytes of the compute dtype
  // Bytes of the master (parameter) dtype when it differs from the compute dtype (mixed
  // precision, Note [Compute dtype] in layers/module.h), else 0: every parameter use is then a
  // cast held by the op that saves it, and a weight's gradient is cast back to the master dtype.
  int64_t w = 0;
  // The kernels' scratch differs by device: the CPU's gemm_dgelu_bgrad computes into a scratch of
  // dpre's size; CUDA's runs fused in cuBLASLt's epilogue for 16-bit dtypes when F is a multiple
  // of 8, else into an f32 accumulator (16-bit) or dpre itself (Note [Unfused epilogues] in
  // kernels/cuda/matmul.cu).
  bool cuda = false;
  // model.dropout > 0 (Block::residual_dropout): each branch's output is replaced by its dropped
  // copy; the masks are counters, nothing is saved, and backward writes one more gradient.
  bool dropout = false;
  // Packed documents (data.packing): the micro-batch brings its positions (the step's batch),
  // where a window's are made for the call.
  bool packed = false;
  // SDP under forward masking (parallel/sdp, Note [SDP packed MLP] and Note [SDP block
  // masking]): each block's MLP hidden on this worker (empty: F for every block); the MLP's
  // output layer rescaled (coverage < 1 at the neuron level: GPT-2's MLP then runs unfused — fc
  // with its bias, GELU, proj, the scale, proj's bias added apart; Llama's down then scaled); or
  // each residual branch rescaled (the block level), which like dropout replaces the branch in
  // forward and writes one more gradient in backward.
  std::vector<int64_t> block_ffn;
  bool scaled_mlp_out = false;
  double branch_scale = 1.0;
  // Tensor parallelism over `tp` ranks (parallel/tp/layers.h): q, kv, heads, F and V above are
  // this rank's; the TP layers' own temporaries are replayed. With sequence parallelism the
  // residual stream (norms, residual adds, dropout, the block's input and output) holds B·T/tp
  // rows; column layers gather them and row layers reduce-scatter back.
  int64_t tp = 1;
  bool sp = false;
  // The model is built from the mesh's layers (parallel/mesh_layers.h: tp > 1 or cp > 1): the
  // TP layers' code paths run even over one TP rank (no fused MLP, the vocab-parallel lookup
  // and loss, the head's input copied).
  bool mesh = false;
  // Context parallelism over `cp` ranks: T above is this rank's T/cp tokens, and attention is
  // parallel/cp/ring_attention.cpp's (train/planner/ring_replay.h).
  int64_t cp = 1;
  int64_t s = 4;  // bytes of norm statistics, attention lse and loss rows
  // How a weight's gradient lands: kept as the parameter's .grad (the first micro-batch of a
  // single process), or added into a buffer that exists (later micro-batches, data-parallel
  // buckets) and freed.
  bool keep_weight_grads = true;
  UnitEvents* units = nullptr;  // ZeRO-3's gatherer, or none
  // The units' numbering is the model's: a pipeline chunk's first block is `first_block`, the
  // head's unit is layers + 1 (0: the blocks replayed here), and a tied head re-enters unit 0
  // when `head_reads_table` (on a pipeline's last stage: its copy of the table).
  int64_t first_block = 0, layers = 0;
  bool head_reads_table = false;
  // A tied table's gradient from the head is taken at once by a partial-gradient hook (DDP's
  // table shortcut in a syncing micro-batch); otherwise the autograd engine holds it until the
  // embedding's arrives and sums the two (Note [Partial gradients] in core/autograd.h).
  bool tied_partial_taken = false;
};

// Per-block weight-gradient bytes that stay as .grad when keep_weight_grads (the replay adds
// them to the timeline; the caller frees them at zero_grad).
struct ReplayGrads {
  std::vector<ByteTimeline::Id> kept;
};

// A selective region's tape (Note [Selective recompute] in core/checkpoint.h): handles sharing
// the kept ops' results (ByteTimeline::share), in call order. Recording (the region's forward),
// the kept ops add theirs; replaying (the recomputation), the same calls take them instead of
// allocating.
struct KeptResults {
  uint32_t keep = 0;  // ReplayShape::keep
  bool replaying = false;
  size_t next = 0;
  std::vector<ByteTimeline::Id> ids;
};

// What one block's backward frees: its saved tensors (handles on the timeline).
struct BlockTape {
  ByteTimeline::Id x = 0;                      // the block's input (saved by its first norm)
  ByteTimeline::Id y1 = 0, st1 = 0, st1b = 0;  // norm1 output and statistics
  ByteTimeline::Id qc = 0, kc = 0, vc = 0, att = 0, lse = 0;  // attention's saved tensors
  ByteTimeline::Id ytr = 0;                           // the heads put back in rows (proj's input)
  ByteTimeline::Id h = 0, y2 = 0, st2 = 0, st2b = 0;  // the residual after attention, norm2's
  ByteTimeline::Id pre = 0;                           // gpt2: the fused MLP's pre-activation
  ByteTimeline::Id gate = 0, up = 0, act = 0;         // llama: SwiGLU's inputs and output
  // Mixed precision: the parameters' compute-dtype casts the ops keep for backward (norm1, qkv,
  // proj, norm2, then the MLP's: gpt2 fc and proj, llama gate, up and down).
  ByteTimeline::Id cn1 = 0, cqkv = 0, cproj = 0, cn2 = 0, cm1 = 0, cm2 = 0, cm3 = 0;
  std::vector<ByteTimeline::Id> kept;  // a selective checkpointed block: its tape's handles
};

// The forward of one micro-batch through `blocks` blocks, with the embeddings when `embed` and
// the final norm, head and loss when `head`; what backward needs stays on the timeline.
struct StageActivations {
  std::vector<BlockTape> blocks;
  ByteTimeline::Id output = 0;                  // without the head: the last block's output
  ByteTimeline::Id positions = 0, embed_x = 0;  // gpt2: wpe's saved positions
  ByteTimeline::Id hf = 0, stf = 0, stfb = 0;   // final norm output and statistics
  ByteTimeline::Id logits = 0, lse = 0;         // the loss's saved tensors
  ByteTimeline::Id table_grad = 0;              // the head's wte gradient the engine holds
  ByteTimeline::Id cnf = 0, chead = 0;          // mixed precision: final norm's and head's casts
  ByteTimeline::Id tp_ids = 0, tp_mask = 0;     // TP: the vocab-parallel lookup's saved tensors
};

// Without `embed`, `input` is the stage's input (the caller's handle: the first block saves it).
// Without `head`, the last block's output stays on the timeline as `output`, the caller's.
StageActivations replay_forward(ByteTimeline& tl, const ReplayShape& s, int64_t blocks, bool embed,
                                bool head, ByteTimeline::Id input = 0);
// The backward of those activations; `grad_in` is the gradient arriving at the stage's output
// (0 at the loss). Leaves the gradient of the stage's input on the timeline (returned, 0 when
// the stage embeds).
ByteTimeline::Id replay_backward(ByteTimeline& tl, const ReplayShape& s, StageActivations& a,
                                 ByteTimeline::Id grad_in, ReplayGrads& grads, bool embed,
                                 bool head);

}  // namespace loom::planner
