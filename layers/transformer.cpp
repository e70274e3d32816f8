// layers/transformer.cpp — Transformer, validate() and count_parameters() (see
// layers/transformer.h).
#include "layers/transformer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/checkpoint.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/matmul.h"
#include "kernels/attention.h"
#include "layers/init.h"
#include "layers/rope_scaling.h"

namespace loom {

namespace {

void require_positive(const char* key, double value) {
  LOOM_CONFIG_CHECK(value > 0, "model.", key, ": must be positive, got ", value);
}

// Validates config and returns it (lets the constructor validate before building members).
const ModelConfig& validated(const ModelConfig& config) {
  validate(config);
  return config;
}

std::string index_list(const std::vector<int64_t>& v) {
  std::string out = "{";
  for (size_t j = 0; j < v.size(); ++j) {
    if (j > 0) out += ", ";
    out += std::to_string(v[j]);
  }
  return out + "}";
}

// Ascending, without repeats, within [0, n_layer).
bool ascending_in(const std::vector<int64_t>& v, int64_t n_layer) {
  for (size_t j = 0; j < v.size(); ++j) {
    if (v[j] < 0 || v[j] >= n_layer || (j > 0 && v[j] <= v[j - 1])) return false;
  }
  return true;
}

// The blocks `selection` holds (Note [Block selection] in layers/build_context.h): every block
// when there is none or its list is empty; checked.
std::vector<int64_t> held_blocks_of(const BlockSelection* selection, int64_t n_layer) {
  std::vector<int64_t> held;
  if (selection == nullptr || selection->held.empty()) {
    for (int64_t i = 0; i < n_layer; ++i) held.push_back(i);
  } else {
    held = selection->held;
    LOOM_CHECK(ascending_in(held, n_layer), "Transformer: the block selection's held blocks ",
               index_list(held),
               " are not ascending block indices in [0, model.n_layer = ", n_layer, ")");
  }
  if (selection != nullptr) {
    const std::vector<int64_t>& frozen = selection->frozen;
    bool within = ascending_in(frozen, n_layer);
    for (int64_t i : frozen) within = within && std::binary_search(held.begin(), held.end(), i);
    LOOM_CHECK(within, "Transformer: the block selection's frozen blocks ", index_list(frozen),
               " are not ascending indices of held blocks ", index_list(held));
  }
  return held;
}

}  // namespace

void validate(const ModelConfig& c) {
  LOOM_CONFIG_CHECK(c.arch == "gpt2" || c.arch == "llama", "model.arch: unknown architecture '",
                    c.arch, "' (expected gpt2 or llama)");
  require_positive("vocab_size", static_cast<double>(c.vocab_size));
  require_positive("vocab_multiple", static_cast<double>(c.vocab_multiple));
  require_positive("n_layer", static_cast<double>(c.n_layer));
  require_positive("n_head", static_cast<double>(c.n_head));
  require_positive("n_embd", static_cast<double>(c.n_embd));
  require_positive("max_seq_len", static_cast<double>(c.max_seq_len));
  LOOM_CONFIG_CHECK(c.n_kv_head >= 0, "model.n_kv_head: must be 0 (= n_head) or positive, got ",
                    c.n_kv_head);
  LOOM_CONFIG_CHECK(c.recompute == "none" || c.recompute == "full" || c.recompute == "selective",
                    "model.recompute: unknown '", c.recompute, "' (none, full, selective)");
  if (c.recompute == "selective") parse_kept_ops(c.recompute_save, "model.recompute_save");
  LOOM_CONFIG_CHECK(c.ffn_hidden >= 0, "model.ffn_hidden: must be 0 (default) or positive, got ",
                    c.ffn_hidden);
  if (c.is_llama() && c.ffn_hidden == 0)
    require_positive("ffn_multiple", static_cast<double>(c.ffn_multiple));
  LOOM_CONFIG_CHECK(c.explicit_head_dim >= 0,
                    "model.head_dim: must be 0 (n_embd / n_head) or "
                    "positive, got ",
                    c.explicit_head_dim);
  LOOM_CONFIG_CHECK(c.explicit_head_dim > 0 || c.n_embd % c.n_head == 0, "model.n_embd: ", c.n_embd,
                    " is not divisible by model.n_head ", c.n_head);
  LOOM_CONFIG_CHECK(
      c.is_llama() || c.explicit_head_dim == 0 || c.explicit_head_dim * c.n_head == c.n_embd,
      "model.head_dim: a gpt2 model's heads are n_embd / n_head wide");
  LOOM_CONFIG_CHECK(c.is_llama() || !(c.attention_bias || c.qkv_bias || c.mlp_bias),
                    "model.attention_bias / qkv_bias / mlp_bias: for llama models (gpt2 has every "
                    "bias)");
  LOOM_CONFIG_CHECK(c.is_llama() || !c.qk_norm, "model.qk_norm: for llama models");
  LOOM_CONFIG_CHECK(c.n_head % c.kv_heads() == 0, "model.n_kv_head: ", c.n_kv_head,
                    " does not divide model.n_head ", c.n_head);
  LOOM_CONFIG_CHECK(
      !c.is_llama() || c.head_dim() % 2 == 0,
      c.explicit_head_dim > 0 ? "model.head_dim: " : "model.n_embd: head dim n_embd/n_head = ",
      c.head_dim(), " must be even for RoPE (llama)");
  if (c.is_llama()) require_positive("rope_theta", c.rope_theta);
  validate_rope_scaling(c);
  LOOM_CONFIG_CHECK(c.sliding_window >= 0, "model.sliding_window: must be 0 (none) or positive");
  require_positive("norm_eps", c.norm_eps);
  require_positive("init_std", c.init_std);
  LOOM_CONFIG_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, "model.dropout: must be in [0, 1), got ",
                    c.dropout);
  // Note [Size bounds]: every size is bounded by what could ever be allocated, so no product of
  // sizes below overflows int64 (each factor < 2^31) and no tensor exceeds 2^40 elements.
  constexpr int64_t kMaxDim = int64_t{1} << 31, kMaxElements = int64_t{1} << 40;
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                               {"vocab_multiple", c.vocab_multiple},
                               {"n_layer", c.n_layer},
                               {"n_head", c.n_head},
                               {"n_kv_head", c.n_kv_head},
                               {"n_embd", c.n_embd},
                               {"head_dim", c.explicit_head_dim},
                               {"max_seq_len", c.max_seq_len},
                               {"ffn_hidden", c.ffn_hidden},
                               {"ffn_multiple", c.ffn_multiple}}) {
    LOOM_CONFIG_CHECK(v < kMaxDim, "model.", key, ": ", v,
                      " exceeds the largest size Loom allocates (", kMaxDim - 1, ")");
  }
  const int64_t widest = std::max({c.padded_vocab(), c.max_seq_len, c.ffn_hidden_size(),
                                   3 * c.n_embd, (c.n_head + 2 * c.kv_heads()) * c.head_dim()});
  LOOM_CONFIG_CHECK(widest * c.n_embd <= kMaxElements, "model.n_embd: ", c.n_embd, " × ", widest,
                    " rows makes a tensor of more than 2^40 elements");
}

int64_t count_parameters(const ModelConfig& c, bool exclude_padding) {
  validate(c);
  const int64_t C = c.n_embd, H = c.ffn_hidden_size();
  const int64_t V = exclude_padding ? c.vocab_size : c.padded_vocab();
  const int64_t kv = c.kv_heads() * c.head_dim(), q = c.n_head * c.head_dim();
  const bool llama = c.is_llama();
  const int64_t norm = llama ? C : 2 * C;
  int64_t layer = 2 * norm + C * (q + 2 * kv) + q * C;  // norms, qkv, proj
  layer += llama ? 3 * C * H : 2 * C * H;
  if (c.has_qkv_bias()) layer += q + 2 * kv;
  if (c.has_proj_bias()) layer += C;
  if (c.has_mlp_bias()) layer += (llama ? 2 * H : H) + C;  // gate and up (or fc), down (proj)
  if (c.qk_norm) layer += 2 * c.head_dim();
  int64_t n = V * C + c.n_layer * layer + norm;
  if (!llama) n += c.max_seq_len * C;  // wpe
  if (!c.tie_embeddings) n += V * C;   // lm_head
  return n;
}

Transformer::Transformer(const ModelConfig& config, DType dtype, Device device,
                         const LayerContext& ctx)
    : config_(validated(config)),
      dtype_(dtype),
      device_(device),
      linear_(ctx.linear),
      loss_(ctx.loss),
      layout_(ctx.layout) {
  LOOM_CHECK(is_floating(dtype), "Transformer: dtype ", dtype_name(dtype), " is not floating");
  const bool llama = config_.is_llama();
  const int64_t Vp = config_.padded_vocab(), C = config_.n_embd;
  wte_ = linear_->vocab_embedding(Vp, C, dtype, device);
  register_module("wte", *wte_);
  if (!llama) {
    wpe_ = std::make_unique<Embedding>(config_.max_seq_len, config_.n_embd, dtype, device);
    register_module("wpe", *wpe_);
  }
  // Note [Selected blocks]: the held blocks under their global names and indices.
  held_ = held_blocks_of(ctx.blocks.get(), config_.n_layer);
  slot_.assign(static_cast<size_t>(config_.n_layer), -1);
  for (int64_t i : held_) {
    slot_[static_cast<size_t>(i)] = static_cast<int64_t>(blocks_.size());
    blocks_.push_back(std::make_unique<Block>(config_, dtype, device, ctx, i));
    register_module("blocks." + std::to_string(i), *blocks_.back());
  }
  if (ctx.blocks) {
    for (int64_t i : ctx.blocks->frozen) {
      for (auto [name, p] : block(i).named_parameters()) p.set_requires_grad(false);
    }
  }
  if (llama) {
    norm_f_ = std::make_unique<RMSNorm>(config_.n_embd, config_.norm_eps, dtype, device, ctx);
  } else {
    norm_f_ =
        std::make_unique<LayerNorm>(config_.n_embd, config_.norm_eps, true, dtype, device, ctx);
  }
  register_module(llama ? "norm_f" : "ln_f", *norm_f_);
  if (!config_.tie_embeddings) {
    lm_head_ = linear_->column(C, {Vp}, false, dtype, device);
    register_module("lm_head", *lm_head_);
  }
  record_roles();
}

// Note [Parameter roles]: every parameter's ParamRole (core/param_role.h), from the modules that
// hold it: the input tables' (wte, wpe), each held block's under its global index with the
// names inside the block, and the rest (final norm, head) — the structure the constructor just
// built, so nothing downstream parses "blocks.<l>." names.
void Transformer::record_roles() {
  auto mark = [](const Module& m, const std::string& prefix, ParamRole::Part part, int64_t block) {
    for (auto [name, p] : m.named_parameters()) p.set_role({part, block, prefix + name});
  };
  mark(*this, "", ParamRole::Part::kOutput, -1);  // then refined below
  mark(*wte_, "wte.", ParamRole::Part::kInput, -1);
  if (wpe_) mark(*wpe_, "wpe.", ParamRole::Part::kInput, -1);
  for (size_t k = 0; k < blocks_.size(); ++k)
    mark(*blocks_[k], "", ParamRole::Part::kBlock, held_[k]);
}

void Transformer::init_weights(Generator& gen) {
  const double std = config_.init_std;
  const double proj_std = std / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  wte_->init(gen, std, config_.vocab_size);
  if (wpe_) wpe_->init(gen, std);
  // Note [Selected blocks]: a block not held advances the generator by what a block draws.
  uint64_t per_block = 0;
  if (static_cast<int64_t>(blocks_.size()) < config_.n_layer) {
    Generator scratch(gen.seed());
    blocks_.front()->init(scratch, std, proj_std);  // drawn again below
    per_block = scratch.state().offset;
  }
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const int64_t slot = slot_[static_cast<size_t>(i)];
    if (slot >= 0) {
      blocks_[static_cast<size_t>(slot)]->init(gen, std, proj_std);
    } else {
      GeneratorState state = gen.state();
      state.offset += per_block;
      gen.set_state(state);
    }
  }
  norm_f_->reset();
  if (lm_head_) {
    lm_head_->init(gen, std);
    lm_head_->zero_rows_from(config_.vocab_size);
  }
}

const Tensor& Transformer::head_weight() const {
  return lm_head_ ? lm_head_->weight() : wte_->weight();
}

Tensor Transformer::positions(int64_t T) const { return host_positions(T).to(device_); }

Tensor Transformer::host_positions(int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) p[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  return Tensor::from_vector(p, {T});
}

// Note [Host ids]: token ids and positions that arrive on the host go to the embedding lookups
// as they are: ops::embedding checks them on the host and uploads them, so the device lookups
// skip their own id check and the host synchronisation it costs (core/ops/embedding.h). The
// blocks get the positions uploaded, and packed documents' doc_start checked on the host (the
// attention op cannot check the rule on the device without reading it back) and uploaded once
// for every block.
Tensor Transformer::embed(const Tensor& ids, const Tensor& pos) const {
  enter(0);
  Tensor x = wte_->forward(ids);  // (B, R, C): R = T, or T/tp under sequence parallelism
  if (wpe_) {  // + (R, C): the positions of this rank's rows, the complete gradient
    x = ops::add(x, compute(ops::embedding(layout_->row_positions(pos),
                                           linear_->replicated_param(wpe_->weight()))));
  }
  return leave(0, x);
}

Tensor Transformer::forward(const Tensor& ids, const DropoutKey* dropout) const {
  LOOM_CHECK(ids.dim() == 2, "Transformer.forward: ids must be (B, T), got ",
             shape_str(ids.shape()));
  LOOM_CHECK(ids.size(1) <= config_.max_seq_len, "Transformer.forward: sequence length ",
             ids.size(1), " exceeds model.max_seq_len ", config_.max_seq_len);
  return forward(ids, host_positions(ids.size(1)), dropout);  // Note [Host ids]
}

Tensor Transformer::forward(const Tensor& ids, const Tensor& pos, const DropoutKey* dropout) const {
  return forward(ids, pos, dropout, Tensor());
}

Tensor Transformer::forward(const Tensor& ids, const Tensor& pos, const DropoutKey* dropout,
                            const Tensor& doc_start) const {
  LOOM_CHECK(ids.dim() == 2, "Transformer.forward: ids must be (B, T), got ",
             shape_str(ids.shape()));
  LOOM_CHECK(pos.dim() == 1 && pos.size(0) == ids.size(1), "Transformer.forward: positions ",
             shape_str(pos.shape()), " do not match T = ", ids.size(1));
  // Note [Host ids]; under cp the whole sequence's documents (Note [Sliding window])
  kernels::check_documents(doc_start, layout_->sequence_length(ids.size(1)), "Transformer.forward");
  return head_logits(
      run_blocks(embed(ids, pos), pos.to(device_), 0, num_blocks(), dropout, doc_start));
}

// Note [Sliding window]: with model.sliding_window W (Mistral's), row i attends keys j with
// i − W < j ≤ i (transformers' mask: kv_idx > q_idx − sliding_window), and never across a packed
// document. The attention kernels take each row's first key (Note [Packed documents] in
// kernels/attention.h), so the window is max(document start, i − W + 1), made here on the host
// once per call for every block and uploaded with the documents; sequences no longer than W
// need none (the causal mask is the window). Under context parallelism a rank holds only part of
// the sequence: the first keys are then the whole sequence's (T = the layout's sequence_length),
// which Ulysses attention takes (Note [Ulysses] in parallel/cp/ulysses.h) and ring attention
// refuses (train/config.cpp refuses that config first, naming model.sliding_window).
Tensor Transformer::first_keys(const Tensor& doc_start, const Tensor& pos) const {
  const int64_t w = config_.sliding_window, t = layout_->sequence_length(pos.size(0));
  if (w == 0 || t <= w) return doc_start.defined() ? doc_start.detach().to(device_) : Tensor();
  LOOM_CHECK(!doc_start.defined() || doc_start.size(0) == t, "model.sliding_window: documents of ",
             doc_start.defined() ? doc_start.size(0) : 0, " tokens in a sequence of ", t);
  const Tensor docs = doc_start.defined() ? doc_start.detach().to(Device::cpu()) : Tensor();
  std::vector<int32_t> first(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    const int64_t doc = docs.defined() ? docs.data<int32_t>()[i] : 0;
    first[static_cast<size_t>(i)] = static_cast<int32_t>(std::max(doc, i - w + 1));
  }
  return Tensor::from_vector(first, {t}).to(device_);
}

Tensor Transformer::run_blocks(Tensor x, const Tensor& pos, int64_t begin, int64_t end,
                               const DropoutKey* dropout, const Tensor& doc_start) const {
  LOOM_CHECK(0 <= begin && begin <= end && end <= num_blocks(), "Transformer.run_blocks: [", begin,
             ", ", end, ") is not a range of the ", num_blocks(), " blocks");
  const Tensor docs = first_keys(doc_start, pos);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t slot = slot_[static_cast<size_t>(i)];
    if (slot < 0) continue;  // not held: the residual path (Note [Selected blocks])
    const int unit = static_cast<int>(i) + 1;  // unit 0 is the embeddings (parameter_units)
    enter(unit);
    x = leave(unit, blocks_[static_cast<size_t>(slot)]->forward(x, pos, dropout, docs));
  }
  return x;
}

bool Transformer::holds_block(int64_t i) const {
  return 0 <= i && i < config_.n_layer && slot_[static_cast<size_t>(i)] >= 0;
}

const Block& Transformer::block(int64_t i) const {
  LOOM_CHECK(holds_block(i), "Transformer.block: block ", i,
             " is not held here (model.n_layer = ", config_.n_layer, ", held ", index_list(held_),
             ")");
  return *blocks_[static_cast<size_t>(slot_[static_cast<size_t>(i)])];
}

void Transformer::set_unit_hooks(UnitHooks* hooks) {
  LOOM_CHECK(hooks == nullptr || static_cast<int64_t>(blocks_.size()) == config_.n_layer,
             "Transformer.set_unit_hooks: this model holds blocks ", index_list(held_), " of ",
             config_.n_layer,
             " (a block selection); ZeRO-3 unit hooks over a subnetwork are not "
             "supported (Note [Parameter units])");
  hooks_ = hooks;
}

Tensor Transformer::head_logits(const Tensor& x) const {
  const int head = static_cast<int>(config_.n_layer) + 1;
  enter(head);
  if (!lm_head_) enter(0);  // the tied head reads wte.weight
  Tensor h = norm_f_->forward(x);
  h = linear_->column_input(h);
  // (B, T, Vp), or (B, T, Vp/tp); Note [Compute dtype] in layers/module.h
  Tensor logits = ops::matmul(h, compute(head_weight()), false, true);
  if (!lm_head_) logits = leave(0, logits);
  return leave(head, logits);
}

Tensor Transformer::head_loss(const Tensor& x, const Tensor& targets) const {
  // x holds this rank's activation rows (B, R, C) of its T tokens (R = T/tp under sequence
  // parallelism).
  const int64_t T = x.dim() == 3 ? layout_->local_tokens(x.size(1)) : -1;
  LOOM_CHECK(
      targets.dim() == 2 && x.dim() == 3 && targets.size(0) == x.size(0) && targets.size(1) == T,
      "Transformer.head_loss: targets ", shape_str(targets.shape()),
      " do not match the activation ", shape_str(x.shape()));
  const Tensor logits = head_logits(x);
  return loss_(logits, targets, -100, config_.vocab_size);
}

void Transformer::enter(int unit) const {
  if (hooks_) hooks_->before_forward(unit);
}

Tensor Transformer::leave(int unit, const Tensor& out) const {
  return hooks_ ? hooks_->after_forward(unit, out) : out;
}

std::vector<std::vector<std::pair<std::string, Tensor>>> Transformer::parameter_units() const {
  const size_t head = static_cast<size_t>(config_.n_layer) + 1;  // Note [Parameter units]
  std::vector<std::vector<std::pair<std::string, Tensor>>> units(head + 1);
  for (auto& [name, p] : named_parameters()) {  // by role (Note [Parameter roles])
    size_t unit = head;
    const ParamRole* role = p.role();
    if (role != nullptr && role->part == ParamRole::Part::kInput) {
      unit = 0;
    } else if (block_of(role) >= 0) {
      unit = 1 + static_cast<size_t>(block_of(role));
    }
    units[unit].emplace_back(name, p);
  }
  return units;
}

Tensor Transformer::loss(const Tensor& ids, const Tensor& targets,
                         const DropoutKey* dropout) const {
  LOOM_CHECK(targets.shape() == ids.shape(), "Transformer.loss: targets ",
             shape_str(targets.shape()), " do not match ids ", shape_str(ids.shape()));
  return loss(ids, targets, host_positions(ids.size(1)), dropout);
}

Tensor Transformer::loss(const Tensor& ids, const Tensor& targets, const Tensor& pos,
                         const DropoutKey* dropout) const {
  return loss(ids, targets, pos, dropout, Tensor());
}

Tensor Transformer::loss(const Tensor& ids, const Tensor& targets, const Tensor& pos,
                         const DropoutKey* dropout, const Tensor& doc_start) const {
  LOOM_CHECK(targets.shape() == ids.shape(), "Transformer.loss: targets ",
             shape_str(targets.shape()), " do not match ids ", shape_str(ids.shape()));
  LOOM_CHECK(ids.dim() == 2, "Transformer.loss: ids must be (B, T), got ", shape_str(ids.shape()));
  // Note [Host ids]; under cp the whole sequence's documents (Note [Sliding window])
  kernels::check_documents(doc_start, layout_->sequence_length(ids.size(1)), "Transformer.loss");
  return head_loss(
      run_blocks(embed(ids, pos), pos.to(device_), 0, num_blocks(), dropout, doc_start), targets);
}

int64_t Transformer::num_parameters(bool exclude_padding) const {
  int64_t n = num_parameters();
  if (!exclude_padding) return n;
  const int64_t pad_rows = config_.padded_vocab() - config_.vocab_size;
  n -= pad_rows * config_.n_embd;
  if (lm_head_) n -= pad_rows * config_.n_embd;
  return n;
}

double model_flops_per_token(const ModelConfig& config, int64_t T) {
  int64_t n = count_parameters(config);
  if (!config.is_llama()) n -= config.max_seq_len * config.n_embd;         // wpe
  if (!config.tie_embeddings) n -= config.padded_vocab() * config.n_embd;  // untied wte
  // Attention's scores and weighted sum: 12·L·(n_head·head_dim)·T (n_embd wide unless head_dim
  // is set).
  const double L = static_cast<double>(config.n_layer),
               Q = static_cast<double>(config.n_head * config.head_dim());
  return 6.0 * static_cast<double>(n) + 12.0 * L * Q * static_cast<double>(T);
}

double Transformer::flops_per_token(int64_t T) const {
  // From the config, not this rank's tensors: the whole model's FLOPs however tp, pp or cp shard
  // it (Note [Throughput] in train/train_step.cpp divides the job's FLOPs by its ranks).
  return model_flops_per_token(config_, T);
}

}  // namespace loom
