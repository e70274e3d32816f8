// train/config.cpp — YAML ↔ Config through one field list (visit_fields), plus validation.
#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "core/yaml_util.h"
#include "kernels/attention.h"
#include "layers/transformer.h"
#include "parallel/dp/options.h"
#include "parallel/odc/options.h"
#include "parallel/pp/partition.h"
#include "parallel/pp/schedule.h"

namespace loom {
namespace {

// Every configurable field, once: (section, key, field). Parsing, printing and the unknown-key
// check all walk this list.
template <typename V>
void visit_fields(Config& c, V&& v) {
  ModelConfig& m = c.model;
  v("model", "arch", m.arch);
  v("model", "vocab_size", m.vocab_size);
  v("model", "vocab_multiple", m.vocab_multiple);
  v("model", "n_layer", m.n_layer);
  v("model", "n_head", m.n_head);
  v("model", "n_kv_head", m.n_kv_head);
  v("model", "n_embd", m.n_embd);
  v("model", "head_dim", m.explicit_head_dim);
  v("model", "max_seq_len", m.max_seq_len);
  v("model", "ffn_hidden", m.ffn_hidden);
  v("model", "ffn_multiple", m.ffn_multiple);
  v("model", "rope_theta", m.rope_theta);
  v("model", "attention_bias", m.attention_bias);
  v("model", "qkv_bias", m.qkv_bias);
  v("model", "mlp_bias", m.mlp_bias);
  v("model", "qk_norm", m.qk_norm);
  v("model", "sliding_window", m.sliding_window);
  v("model", "norm_eps", m.norm_eps);
  v("model", "dropout", m.dropout);
  v("model", "init_std", m.init_std);
  v("model", "tie_embeddings", m.tie_embeddings);
  v("model", "recompute", m.recompute);
  v("model", "recompute_save", m.recompute_save);
  v("model", "init_from", c.train.init_from);
  RopeScaling& rs = m.rope_scaling;
  v("model.rope_scaling", "type", rs.type);
  v("model.rope_scaling", "factor", rs.factor);
  v("model.rope_scaling", "low_freq_factor", rs.low_freq_factor);
  v("model.rope_scaling", "high_freq_factor", rs.high_freq_factor);
  v("model.rope_scaling", "original_max_seq_len", rs.original_max_seq_len);
  v("model.rope_scaling", "beta_fast", rs.beta_fast);
  v("model.rope_scaling", "beta_slow", rs.beta_slow);
  v("model.rope_scaling", "attention_factor", rs.attention_factor);
  v("model.rope_scaling", "mscale", rs.mscale);
  v("model.rope_scaling", "mscale_all_dim", rs.mscale_all_dim);
  v("model.rope_scaling", "truncate", rs.truncate);
  DataConfig& d = c.data;
  v("data", "train", d.train);
  v("data", "val", d.val);
  v("data", "batch_size", d.batch_size);
  v("data", "global_batch", d.global_batch);
  v("data", "seq_len", d.seq_len);
  v("data", "seed", d.seed);
  v("data", "packing", d.packing);
  v("data", "max_tokens_per_microbatch", d.max_tokens_per_microbatch);
  v("data", "balance", d.balance);
  v("data", "tokenizer", d.tokenizer);
  OptimConfig& o = c.optim;
  v("optim", "name", o.name);
  v("optim", "lr", o.lr);
  v("optim", "min_lr", o.min_lr);
  v("optim", "schedule", o.schedule);
  v("optim", "warmup_steps", o.warmup_steps);
  v("optim", "decay_fraction", o.decay_fraction);
  v("optim", "beta1", o.beta1);
  v("optim", "beta2", o.beta2);
  v("optim", "eps", o.eps);
  v("optim", "weight_decay", o.weight_decay);
  v("optim", "decay_rule", o.decay_rule);
  v("optim", "momentum", o.momentum);
  v("optim", "grad_clip", o.grad_clip);
  v("optim", "grad_accum", o.grad_accum);
  TrainConfig& t = c.train;
  v("train", "steps", t.steps);
  v("train", "seed", t.seed);
  v("train", "device", t.device);
  v("train", "dtype", t.dtype);
  v("train", "precision", t.precision);
  v("train", "allow_tf32", t.allow_tf32);
  v("train", "attention_kernel", t.attention_kernel);
  v("train", "loss_scaling", t.loss_scaling);
  v("train", "initial_loss_scale", t.initial_loss_scale);
  v("train", "peak_flops", t.peak_flops);
  v("train", "log_every", t.log_every);
  v("train", "noise_scale", t.noise_scale);
  v("train", "batch_ramp_steps", t.batch_ramp_steps);
  v("train", "batch_ramp_start", t.batch_ramp_start);
  v("train", "val_every", t.val_every);
  v("train", "val_steps", t.val_steps);
  v("train", "sample_every", t.sample_every);
  v("train", "sample_tokens", t.sample_tokens);
  v("train", "temperature", t.temperature);
  v("train", "top_k", t.top_k);
  v("train", "out_dir", t.out_dir);
  CheckpointConfig& k = c.checkpoint;
  v("checkpoint", "every", k.every);
  v("checkpoint", "keep", k.keep);
  v("checkpoint", "at_end", k.at_end);
  v("checkpoint", "async", k.async);
  LoggingConfig& l = c.logging;
  v("logging", "jsonl", l.jsonl);
  v("logging", "tensorboard", l.tensorboard);
  ParallelConfig& p = c.parallel;
  v("parallel", "dp", p.dp);
  v("parallel", "zero_stage", p.zero_stage);
  v("parallel", "mics_partition_size", p.mics_partition_size);
  v("parallel", "bucket_mb", p.bucket_mb);
  v("parallel", "overlap", p.overlap);
  v("parallel", "table_shortcuts", p.table_shortcuts);
  v("parallel", "odc", p.odc);
  v("parallel", "odc_deterministic", p.odc_deterministic);
  v("parallel", "comm_timeout_s", p.comm_timeout_s);
  v("parallel", "tp_across_hosts", p.tp_across_hosts);
  v("parallel", "backend", p.backend);
  v("parallel", "pp", p.pp);
  v("parallel", "vpp", p.vpp);
  v("parallel", "microbatches", p.microbatches);
  v("parallel", "schedule", p.schedule);
  v("parallel", "schedule_costs", p.schedule_costs);
  v("parallel", "pp_layout", p.pp_layout);
  v("parallel", "tp", p.tp);
  v("parallel", "cp", p.cp);
  v("parallel", "cp_attention", p.cp_attention);
  v("parallel", "cp_ulysses", p.cp_ulysses);
  v("parallel", "sequence_parallel", p.sequence_parallel);
  // A nested mapping: "parallel.sdp" is a section inside parallel (Note [Nested sections]).
  v("parallel.sdp", "mode", p.sdp.mode);
  v("parallel.sdp", "level", p.sdp.level);
  v("parallel.sdp", "coverage", p.sdp.coverage);
  v("parallel.sdp", "seed", p.sdp.seed);
  v("parallel.sdp", "workers", p.sdp.workers);
  v("parallel.sdp", "heads", p.sdp.heads);
  parallel::diloco::DilocoOptions& lo = p.diloco;
  v("parallel.diloco", "islands", lo.islands);
  v("parallel.diloco", "island", lo.island);
  v("parallel.diloco", "rendezvous", lo.rendezvous);
  v("parallel.diloco", "address", lo.address);
  v("parallel.diloco", "inner_steps", lo.inner_steps);
  v("parallel.diloco", "outer", lo.outer);
  v("parallel.diloco", "outer_lr", lo.outer_lr);
  v("parallel.diloco", "outer_momentum", lo.outer_momentum);
  v("parallel.diloco", "fragments", lo.fragments);
  v("parallel.diloco", "overlap_steps", lo.overlap_steps);
  v("parallel.diloco", "fragment_alpha", lo.fragment_alpha);
  v("parallel.diloco", "quantize", lo.quantize);
  v("parallel.diloco", "quantize_scaling", lo.quantize_scaling);
  v("parallel.diloco", "quantize_block", lo.quantize_block);
  v("parallel.diloco", "error_feedback", lo.error_feedback);
  v("parallel.diloco", "lanes", lo.lanes);
  v("parallel.diloco", "quorum_timeout_s", lo.quorum_timeout_s);
  v("parallel.diloco", "join_timeout_s", lo.join_timeout_s);
}

// Note [Nested sections]: a section name with a dot ("parallel.sdp") is a mapping under its
// parent section's key; its fields follow the parent's in visit_fields. The reader walks the
// path, the writer nests the mapping, the unknown-key check descends into it, and an override
// "parallel.sdp.mode=forward" sets the nested key.
YAML::Node section_node(const YAML::Node& root, const std::string& section) {
  YAML::Node n;
  n.reset(root);  // Node's operator= would write into the tree: reset() rebinds
  size_t at = 0;
  while (true) {
    const size_t dot = section.find('.', at);
    const std::string part = section.substr(at, dot == std::string::npos ? dot : dot - at);
    const YAML::Node& parent = n;  // const: a lookup never inserts
    if (!parent.IsMap() || !parent[part]) return YAML::Node();
    n.reset(parent[part]);
    if (dot == std::string::npos) return n;
    at = dot + 1;
  }
}

template <typename T>
const char* type_word() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_floating_point_v<T>) return "a number";
  if constexpr (std::is_unsigned_v<T>) return "a non-negative integer";
  return "an integer";
}

std::string node_text(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  return n.IsSequence() ? "a list" : n.IsMap() ? "a mapping" : "nothing";
}

struct Reader {
  const YAML::Node& root;
  template <typename T>
  void operator()(const char* section, const char* key, T& field) const {
    const YAML::Node s = section_node(root, section);
    if (!s || !s.IsMap() || !s[key]) return;
    const YAML::Node n = s[key];
    const std::string where = std::string(section) + "." + key;
    if (!n.IsScalar())
      throw ConfigError(where + ": expected " + type_word<T>() + ", got " + node_text(n));
    try {
      field = n.as<T>();  // integers must be written as integers: "1e3" is not one
    } catch (const YAML::Exception&) {
      throw ConfigError(where + ": expected " + type_word<T>() + ", got " + node_text(n));
    }
  }
};

struct Writer {
  YAML::Emitter& out;
  std::string current;
  template <typename T>
  void operator()(const char* section, const char* key, T& field) {
    const std::string s = section;
    if (current != s) {
      const size_t dot = s.find('.');
      const std::string parent = dot == std::string::npos ? "" : s.substr(0, dot);
      if (dot != std::string::npos && current == parent) {  // nested in current
        out << YAML::Key << s.substr(dot + 1) << YAML::Value << YAML::BeginMap;
      } else if (dot != std::string::npos && current.rfind(parent + ".", 0) == 0) {  // a sibling
        out << YAML::EndMap << YAML::Key << s.substr(dot + 1) << YAML::Value << YAML::BeginMap;
      } else {
        if (!current.empty()) out << YAML::EndMap;
        if (current.find('.') != std::string::npos) out << YAML::EndMap;
        out << YAML::Key << s << YAML::Value << YAML::BeginMap;
      }
      current = s;
    }
    out << YAML::Key << key << YAML::Value << field;
  }
};

// Repeated keys were refused when the text was parsed (parse_yaml_document).
void check_section_keys(const std::string& s, const YAML::Node& node,
                        const std::set<std::string>& sections, const std::set<std::string>& keys) {
  for (const auto& kv : node) {
    if (!kv.first.IsScalar())
      throw ConfigError(s + ": a key must be a plain word, got " + node_text(kv.first));
    const std::string full = s + "." + kv.first.as<std::string>();
    if (sections.count(full)) {  // Note [Nested sections]
      if (kv.second.IsNull()) continue;
      if (!kv.second.IsMap()) throw ConfigError(full + ": expected a mapping of keys");
      check_section_keys(full, kv.second, sections, keys);
      continue;
    }
    if (full == "model.activation_checkpointing")  // the older spelling
      throw ConfigError(full +
                        ": now model.recompute (full for true, none for false; or "
                        "selective)");
    if (!keys.count(full)) throw ConfigError(full + ": unknown key");
  }
}

void check_known_keys(const YAML::Node& root) {
  Config probe;
  std::set<std::string> sections, keys;
  visit_fields(probe, [&](const char* s, const char* k, auto&) {
    sections.insert(s);
    keys.insert(std::string(s) + "." + k);
  });
  if (!root || root.IsNull()) return;
  if (!root.IsMap()) throw ConfigError("config: the top level must be a mapping of sections");
  // Keys must be plain words (each given once: parse_yaml_document refuses a repeated key).
  for (const auto& sec : root) {
    if (!sec.first.IsScalar())
      throw ConfigError("config: a section name must be a plain word, got " + node_text(sec.first));
    const std::string s = sec.first.as<std::string>();
    if (s.find('.') != std::string::npos || !sections.count(s))
      throw ConfigError(s + ": unknown section");
    if (sec.second.IsNull()) continue;
    if (!sec.second.IsMap()) throw ConfigError(s + ": expected a mapping of keys");
    check_section_keys(s, sec.second, sections, keys);
  }
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const size_t dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw ConfigError("--set " + assignment + ": expected section.key=value");
  }
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set " + assignment + ": " + e.msg);
  }
  const size_t inner = key.find('.');  // a nested section's key (Note [Nested sections])
  if (inner != std::string::npos)
    root[section][key.substr(0, inner)][key.substr(inner + 1)] = value;
  else
    root[section][key] = value;
}

void resolve_global_batch(Config& c);
void resolve_pipeline_chunks(Config& c);

Config from_node(YAML::Node root, const std::vector<std::string>& overrides) {
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (const std::string& o : overrides) apply_override(root, o);
  check_known_keys(root);
  Config c;
  visit_fields(c, Reader{root});
  resolve_global_batch(c);
  resolve_pipeline_chunks(c);
  validate_config(c);
  return c;
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw ConfigError(msg);
}

template <typename T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Note [Global batch]: data.global_batch G > 0 fixes the sequences per optimizer step, whatever
// the layout: optim.grad_accum (the pipeline's micro-batches when parallel.microbatches is 0)
// becomes G / (data.batch_size · parallel.dp). Windows are dealt per global batch (Note [Loader
// windows]), so a run resumed at another dp with the same G takes the same windows in every
// step as the uninterrupted run (tests/train/train_reshard_mpi_test.cpp) — what an elastic
// restart on fewer hosts needs (tools/elastic.sh). A grad_accum given beside it must agree.
void resolve_global_batch(Config& c) {
  const int64_t g = c.data.global_batch;
  if (g == 0) return;
  const int64_t per = c.data.batch_size * c.parallel.dp;
  require(g > 0,
          "data.global_batch: must be positive (0: batch_size × dp × grad_accum), got " + str(g));
  require(!c.data.packing,
          "data.global_batch: not supported with data.packing yet (a packed step is "
          "data.batch_size × parallel.dp documents)");
  require(c.data.batch_size > 0 && c.parallel.dp > 0 && g % per == 0,
          "data.global_batch: " + str(g) + " is not a multiple of data.batch_size " +
              str(c.data.batch_size) + " × parallel.dp " + str(c.parallel.dp) + " = " + str(per));
  const int64_t accum = g / per;
  require(c.optim.grad_accum == 1 || c.optim.grad_accum == accum,
          "optim.grad_accum: " + str(c.optim.grad_accum) + " conflicts with data.global_batch " +
              str(g) + " (= data.batch_size " + str(c.data.batch_size) + " × parallel.dp " +
              str(c.parallel.dp) + " × " + str(accum) + "); leave it to data.global_batch");
  require(c.parallel.microbatches == 0 || c.parallel.microbatches == accum,
          "parallel.microbatches: " + str(c.parallel.microbatches) +
              " conflicts with data.global_batch " + str(g) + " (" + str(accum) +
              " micro-batches per step at this data.batch_size and parallel.dp)");
  c.optim.grad_accum = accum;
}

// parallel.vpp left at 1 under a schedule that runs more chunks per rank (zb-v: 2, Note [ZB-V]
// in parallel/pp/schedule.h) becomes that number, so `schedule: zb-v` alone is a whole
// configuration; any other vpp is the schedule's to accept or refuse (validate_schedule).
void resolve_pipeline_chunks(Config& c) {
  ParallelConfig& p = c.parallel;
  if (p.pp <= 1 || p.vpp != 1) return;
  for (parallel::pp::ScheduleKind k : {parallel::pp::ScheduleKind::kZeroBubbleV}) {
    if (p.schedule == parallel::pp::schedule_name(k))
      p.vpp = parallel::pp::default_virtual_stages(k);
  }
}

// parallel.pp, vpp, microbatches, schedule, pp_layout (parallel/pp/schedule.h and partition.h
// check the shapes, naming the keys).
void validate_pipeline_config(const Config& c) {
  const ParallelConfig& p = c.parallel;
  require(p.pp >= 1, "parallel.pp: must be positive, got " + str(p.pp));
  require(p.vpp >= 1, "parallel.vpp: must be positive, got " + str(p.vpp));
  require(p.microbatches >= 0,
          "parallel.microbatches: must be non-negative (0 = optim.grad_accum), got " +
              str(p.microbatches));
  require(p.microbatches == 0 || c.optim.grad_accum == 1 || p.microbatches == c.optim.grad_accum,
          "parallel.microbatches: " + str(p.microbatches) + " conflicts with optim.grad_accum " +
              str(c.optim.grad_accum) +
              " (the pipeline's micro-batches are the accumulation steps; set one of them)");
  const parallel::pp::ScheduleKind kind = parallel::pp::parse_schedule(p.schedule);
  parallel::pp::validate_schedule_costs(kind, parallel::pp::parse_schedule_costs(p.schedule_costs));
  require(p.pp > 1 || p.vpp == 1, "parallel.vpp: virtual stages need parallel.pp > 1");
  if (p.pp == 1) return;
  const int64_t m = pipeline_microbatches(c);
  parallel::pp::validate_schedule(
      kind, parallel::pp::schedule_shape(kind, static_cast<int>(p.pp), static_cast<int>(p.vpp),
                                         static_cast<int>(m)));
  require(kind != parallel::pp::ScheduleKind::k1F1B || m >= p.pp,
          "parallel.microbatches: " + str(m) +
              " micro-batches (optim.grad_accum when 0) are fewer than parallel.pp " + str(p.pp) +
              " stages; 1f1b needs at least one per stage");
  parallel::pp::partition_layers(c.model.n_layer, static_cast<int>(p.pp * p.vpp), p.pp_layout);
}

// parallel.tp, cp, sequence_parallel: what the model must divide, and the combinations the
// trainer runs so far.
void validate_model_parallel_config(const Config& c) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  require(p.tp >= 1, "parallel.tp: must be positive, got " + str(p.tp));
  require(p.cp >= 1, "parallel.cp: must be positive, got " + str(p.cp));
  require(m.n_head % p.tp == 0 && m.kv_heads() % p.tp == 0,
          "parallel.tp: " + str(p.tp) + " does not divide model.n_head " + str(m.n_head) +
              " and its " + str(m.kv_heads()) + " kv heads");
  require(m.ffn_hidden_size() % p.tp == 0, "parallel.tp: " + str(p.tp) +
                                               " does not divide the MLP hidden size " +
                                               str(m.ffn_hidden_size()));
  require(m.padded_vocab() % p.tp == 0 && m.vocab_size > (p.tp - 1) * (m.padded_vocab() / p.tp),
          "parallel.tp: " + str(p.tp) + " does not split the padded vocabulary " +
              str(m.padded_vocab()) + " into parts that each hold real tokens (model.vocab_size " +
              str(m.vocab_size) + ")");
  require(p.cp_attention == "ring" || p.cp_attention == "ulysses" || p.cp_attention == "hybrid",
          "parallel.cp_attention: unknown '" + p.cp_attention + "' (ring, ulysses, hybrid)");
  // Note [Hybrid context parallelism] in parallel/cp/hybrid.h: u Ulysses ranks × cp/u rings.
  const bool hybrid = p.cp_attention == "hybrid";
  require(hybrid || p.cp_ulysses == 0,
          "parallel.cp_ulysses: " + str(p.cp_ulysses) +
              " Ulysses ranks need parallel.cp_attention: hybrid (got " + p.cp_attention + ")");
  require(!hybrid || p.cp_ulysses >= 1,
          "parallel.cp_ulysses: parallel.cp_attention: hybrid needs its Ulysses ranks (>= 1, "
          "dividing parallel.cp " +
              str(p.cp) + "), got " + str(p.cp_ulysses));
  require(!hybrid || p.cp % p.cp_ulysses == 0,
          "parallel.cp_ulysses: " + str(p.cp_ulysses) + " does not divide parallel.cp " +
              str(p.cp) + " (parallel.cp_attention: hybrid runs cp_ulysses Ulysses ranks × cp / " +
              "cp_ulysses ring ranks)");
  // The heads split over the Ulysses ranks (Note [Ulysses] in parallel/cp/ulysses.h).
  const int64_t u = hybrid ? p.cp_ulysses : p.cp_attention == "ulysses" ? p.cp : 1;
  if (u > 1) {
    const int64_t hq = m.n_head / p.tp, hkv = m.kv_heads() / p.tp;
    const std::string key = hybrid ? "parallel.cp_ulysses " : "parallel.cp ";
    require(hq % u == 0, "model.n_head: the " + str(hq) +
                             " heads of a tensor-parallel rank do not split over " + key + str(u) +
                             " (parallel.cp_attention: " + p.cp_attention + " splits heads)");
    require(hkv % u == 0 || u % hkv == 0, "model.n_kv_head: the " + str(hkv) +
                                              " kv heads of a tensor-parallel rank neither " +
                                              "split over nor divide " + key + str(u) +
                                              " (parallel.cp_attention: " + p.cp_attention + ")");
  }
  require(p.cp == 1 || c.data.seq_len % (2 * p.cp) == 0,
          "parallel.cp: data.seq_len " + str(c.data.seq_len) +
              " does not divide into 2·cp = " + str(2 * p.cp) + " chunks (causal load balancing)");
  require(!p.sequence_parallel || p.tp > 1, "parallel.sequence_parallel: needs parallel.tp > 1");
  require(!p.sequence_parallel || c.data.seq_len / p.cp % p.tp == 0,
          "parallel.sequence_parallel: the " + str(c.data.seq_len / p.cp) +
              " tokens per context-parallel rank do not divide by parallel.tp " + str(p.tp));
}

// The keys of `section` whose values differ from the defaults ("parallel.sdp.seed, …").
std::string non_default_keys(const Config& c, const std::string& section) {
  auto values = [&](Config& cfg) {
    std::vector<std::pair<std::string, std::string>> out;
    visit_fields(cfg, [&](const char* s, const char* k, const auto& field) {
      if (section != s) return;
      std::ostringstream v;
      v << field;
      out.emplace_back(section + "." + k, v.str());
    });
    return out;
  };
  Config copy = c, fresh;
  const auto given = values(copy), defaults = values(fresh);
  std::string keys;
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i].second != defaults[i].second) keys += (keys.empty() ? "" : ", ") + given[i].first;
  }
  return keys;
}

// parallel.sdp (docs/parallel.md, "SDP"): SDP's own checks (parallel/sdp/options.h), and a key
// set while SDP is off, which would be ignored, refused.
void validate_sdp_config(const Config& c) {
  const parallel::sdp::SdpOptions& s = c.parallel.sdp;
  const ParallelConfig& p = c.parallel;
  parallel::sdp::SdpLayout layout;
  layout.dp = p.dp;
  layout.tp = p.tp;
  layout.pp = p.pp;
  layout.cp = p.cp;
  layout.zero_stage = p.zero_stage;
  layout.mics_partition_size = p.mics_partition_size;
  layout.odc = p.odc;
  layout.packing = c.data.packing;
  layout.init_from = !c.train.init_from.empty();
  parallel::sdp::validate(s, layout, c.model);
  if (!s.on()) {
    const std::string keys = non_default_keys(c, "parallel.sdp");
    const char* them = keys.find(',') == std::string::npos ? "it" : "them";
    require(keys.empty(), keys + ": set, but parallel.sdp.mode is none (SDP is off) and would " +
                              "ignore " + them + "; set parallel.sdp.mode (forward or backward) " +
                              "or remove " + them);
  }
}

// Note [Precision] in train/config.h.
void validate_precision(const TrainConfig& t) {
  const std::string& p = t.precision;
  require(p == "f32" || p == "f64" || p == "bf16" || p == "f16",
          "train.precision: unknown precision '" + p + "' (f32, bf16, f16; f64 for CPU checks)");
  require(
      p == t.dtype || t.dtype == "f32",
      "train.precision: " + p + " with train.dtype " + t.dtype +
          ": mixed precision keeps f32 master weights (set train.dtype: f32, or train.precision: " +
          t.dtype + ")");
  require((p != "bf16" && p != "f16") || t.device == "cuda",
          "train.precision: " + p +
              " needs train.device: cuda (the CPU kernels compute in f32 and f64 only)");
  require(!t.allow_tf32 || t.device == "cuda",
          "train.allow_tf32: TF32 is a CUDA feature; set train.device: cuda");
  require(
      t.attention_kernel == "auto" || t.attention_kernel == "loom" || t.attention_kernel == "cudnn",
      "train.attention_kernel: unknown value '" + t.attention_kernel + "' (auto, loom, cudnn)");
  require(t.attention_kernel != "cudnn" || t.device == "cuda",
          "train.attention_kernel: cudnn is a CUDA feature; set train.device: cuda");
  require(
      t.attention_kernel != "cudnn" || kernels::cudnn_attention_built(),
      "train.attention_kernel: cudnn, but this build has no cuDNN attention (CMake did not find "
      "cuDNN's frontend headers; tools/install_deps.sh fetches them)");
  require(t.loss_scaling == "auto" || t.loss_scaling == "dynamic" || t.loss_scaling == "none",
          "train.loss_scaling: unknown value '" + t.loss_scaling + "' (auto, dynamic, none)");
  require(t.loss_scaling != "none" || p != "f16",
          "train.loss_scaling: none with train.precision f16 would lose small gradients (use auto "
          "or dynamic)");
  require(
      std::isfinite(t.initial_loss_scale) && t.initial_loss_scale >= 1.0,
      "train.initial_loss_scale: must be finite and at least 1, got " + str(t.initial_loss_scale));
}

// data.packing and its keys (Note [Packed steps] in data/packed_loader.h).
void validate_packing(const Config& c) {
  const DataConfig& d = c.data;
  const ParallelConfig& p = c.parallel;
  require(d.balance == "none" || d.balance == "tokens" || d.balance == "flops",
          "data.balance: '" + d.balance + "' is not one of none, tokens, flops");
  require(d.tokenizer == "gpt2" || (d.tokenizer.starts_with("hf:") && d.tokenizer.size() > 3),
          "data.tokenizer: '" + d.tokenizer +
              "' is not gpt2 or hf:PATH (a tokenizer.json or a directory holding one)");
  require(d.max_tokens_per_microbatch >= 0 && d.max_tokens_per_microbatch <= (int64_t{1} << 40),
          "data.max_tokens_per_microbatch: must be in [0, 2^40] (0 = data.batch_size × "
          "data.seq_len), got " +
              str(d.max_tokens_per_microbatch));
  if (!d.packing) {
    require(d.balance == "none", "data.balance: " + d.balance +
                                     " needs data.packing true (fixed-length windows are "
                                     "equal work already)");
    require(d.max_tokens_per_microbatch == 0,
            "data.max_tokens_per_microbatch: needs data.packing true");
    return;
  }
  require(d.max_tokens_per_microbatch == 0 || d.max_tokens_per_microbatch >= d.seq_len,
          "data.max_tokens_per_microbatch: " + str(d.max_tokens_per_microbatch) +
              " is below data.seq_len " + str(d.seq_len) + " (the longest document must fit)");
  require(c.optim.grad_accum == 1,
          "optim.grad_accum: must be 1 with data.packing (the token budget "
          "data.max_tokens_per_microbatch sets the micro-batches), got " +
              str(c.optim.grad_accum));
  require(p.tp == 1 && p.pp == 1 && (p.cp == 1 || p.cp_attention == "ulysses"),
          "data.packing: not supported with parallel.tp, pp, or cp > 1 with ring attention yet "
          "(data parallelism, ZeRO, MiCS, ODC and cp with parallel.cp_attention: ulysses are)");
}

}  // namespace

void validate_config(const Config& c) {
  validate(c.model);  // layers/transformer.h: the model's own rules
  const DataConfig& d = c.data;
  require(d.batch_size > 0, "data.batch_size: must be positive, got " + str(d.batch_size));
  require(d.seq_len > 0, "data.seq_len: must be positive, got " + str(d.seq_len));
  require(d.batch_size < (int64_t{1} << 31) && d.batch_size * d.seq_len <= (int64_t{1} << 40),
          "data.batch_size: " + str(d.batch_size) + " × data.seq_len " + str(d.seq_len) +
              " tokens per batch is more than Loom allocates");
  require(
      d.seq_len <= c.model.max_seq_len,
      "data.seq_len: " + str(d.seq_len) + " exceeds model.max_seq_len " + str(c.model.max_seq_len));
  require(c.model.sliding_window == 0 || d.seq_len <= c.model.sliding_window ||
              c.parallel.cp == 1 || c.parallel.cp_attention == "ulysses",
          "model.sliding_window: data.seq_len " + str(d.seq_len) + " is longer than the model's " +
              str(c.model.sliding_window) +
              "-token attention window, and context parallelism (parallel.cp " +
              str(c.parallel.cp) + ") with " + c.parallel.cp_attention +
              " attention has no sliding window (parallel.cp_attention: ulysses has)");
  validate_packing(c);
  const OptimConfig& o = c.optim;
  require(o.name == "adamw" || o.name == "sgd",
          "optim.name: unknown optimizer '" + o.name + "' (adamw, sgd)");
  require(o.lr > 0, "optim.lr: must be positive, got " + str(o.lr));
  require(o.min_lr >= 0 && o.min_lr <= o.lr,
          "optim.min_lr: must be in [0, optim.lr], got " + str(o.min_lr));
  require(o.schedule == "cosine" || o.schedule == "linear" || o.schedule == "constant" ||
              o.schedule == "wsd",
          "optim.schedule: unknown schedule '" + o.schedule + "' (cosine, linear, constant, wsd)");
  require(o.warmup_steps >= 0,
          "optim.warmup_steps: must be non-negative, got " + str(o.warmup_steps));
  require(o.decay_fraction > 0 && o.decay_fraction <= 1,
          "optim.decay_fraction: must be in (0, 1], got " + str(o.decay_fraction));
  require(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1: must be in [0, 1), got " + str(o.beta1));
  require(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2: must be in [0, 1), got " + str(o.beta2));
  require(o.eps > 0, "optim.eps: must be positive, got " + str(o.eps));
  require(o.weight_decay >= 0,
          "optim.weight_decay: must be non-negative, got " + str(o.weight_decay));
  require(o.decay_rule == "default" || o.decay_rule == "all" || o.decay_rule == "matrices",
          "optim.decay_rule: unknown rule '" + o.decay_rule + "' (default, all, matrices)");
  require(o.grad_clip >= 0, "optim.grad_clip: must be non-negative, got " + str(o.grad_clip));
  require(o.grad_accum > 0, "optim.grad_accum: must be positive, got " + str(o.grad_accum));
  const TrainConfig& t = c.train;
  require(t.steps > 0, "train.steps: must be positive, got " + str(t.steps));
  require(o.warmup_steps <= t.steps,
          "optim.warmup_steps: " + str(o.warmup_steps) + " exceeds train.steps " + str(t.steps));
  const int64_t wsd_decay = std::llround(o.decay_fraction * static_cast<double>(t.steps));
  require(o.schedule != "wsd" || t.steps - wsd_decay >= o.warmup_steps,
          "optim.decay_fraction: the wsd decay (" + str(wsd_decay) + " of train.steps " +
              str(t.steps) + ") overlaps optim.warmup_steps " + str(o.warmup_steps));
  require(t.device == "cpu" || t.device == "cuda",
          "train.device: unknown device '" + t.device + "' (cpu, cuda)");
  require(t.dtype == "f32" || t.dtype == "f64",
          "train.dtype: unsupported parameter dtype '" + t.dtype +
              "' (f32, f64; for bf16/f16 compute set train.precision)");
  validate_precision(t);
  require(t.log_every > 0, "train.log_every: must be positive, got " + str(t.log_every));
  require(t.val_every >= 0, "train.val_every: must be non-negative, got " + str(t.val_every));
  require(t.val_steps > 0, "train.val_steps: must be positive, got " + str(t.val_steps));
  require(t.sample_every >= 0,
          "train.sample_every: must be non-negative, got " + str(t.sample_every));
  require(t.sample_tokens >= 0 && t.sample_tokens <= (int64_t{1} << 20),
          "train.sample_tokens: must be in [0, 2^20], got " + str(t.sample_tokens));
  require(t.val_steps <= (int64_t{1} << 30),
          "train.val_steps: " + str(t.val_steps) + " is too many");
  require(o.grad_accum <= (int64_t{1} << 30),
          "optim.grad_accum: " + str(o.grad_accum) + " is too many");
  require(t.temperature > 0, "train.temperature: must be positive, got " + str(t.temperature));
  require(t.top_k >= 0, "train.top_k: must be non-negative, got " + str(t.top_k));
  require(t.peak_flops >= 0, "train.peak_flops: must be non-negative, got " + str(t.peak_flops));
  if (t.batch_ramp_steps != 0) {  // Note [Batch ramp] in train/config.h
    require(t.batch_ramp_steps > 0,
            "train.batch_ramp_steps: must be 0 (off) or positive, got " + str(t.batch_ramp_steps));
    require(t.batch_ramp_start >= 1 && t.batch_ramp_start < c.optim.grad_accum,
            "train.batch_ramp_start: must be at least 1 and below optim.grad_accum " +
                str(c.optim.grad_accum) + " (the ramp grows the accumulation), got " +
                str(t.batch_ramp_start));
    require(
        c.parallel.pp == 1 && !c.data.packing && !c.parallel.sdp.on() && !c.parallel.diloco.on(),
        "train.batch_ramp_steps: needs fixed-length windows and the plain step runner (no "
        "pipeline, packing, SDP or DiLoCo)");
  }
  if (t.noise_scale) {  // Note [Gradient noise scale] in train/noise_scale.h
    const ParallelConfig& np = c.parallel;
    require(c.optim.grad_accum >= 2 || np.dp >= 2,
            "train.noise_scale: needs optim.grad_accum >= 2 or parallel.dp >= 2 (the first "
            "micro-batch's gradient, or each rank's before the reduction, is the small batch), "
            "got optim.grad_accum " +
                str(c.optim.grad_accum) + " and parallel.dp " + str(np.dp));
    require(np.tp == 1 && np.pp == 1 && np.cp == 1 && np.zero_stage <= 1 && !np.odc &&
                !np.sdp.on() && !np.diloco.on() && !c.data.packing,
            "train.noise_scale: needs data parallelism alone (one process, DDP or ZeRO-1, "
            "windows): the other layouts reduce gradients while backward runs");
  }
  require(!t.out_dir.empty(), "train.out_dir: must not be empty");
  require(c.checkpoint.every >= 0,
          "checkpoint.every: must be non-negative, got " + str(c.checkpoint.every));
  require(c.checkpoint.keep >= 0,
          "checkpoint.keep: must be non-negative, got " + str(c.checkpoint.keep));
  const ParallelConfig& p = c.parallel;
  require(p.dp >= 1, "parallel.dp: must be positive, got " + str(p.dp));
  parallel::validate(
      parallel::DpOptions{p.dp, p.cp, p.zero_stage, p.mics_partition_size, p.bucket_mb});
  require(p.comm_timeout_s > 0,
          "parallel.comm_timeout_s: must be positive, got " + str(p.comm_timeout_s));
  parallel::odc::validate({p.odc, p.odc_deterministic, p.zero_stage, p.pp});
  require(
      p.backend == "auto" || p.backend == "nccl" || p.backend == "mpi" ||
          p.backend == "mpi_nccl_rules",
      "parallel.backend: unknown backend '" + p.backend + "' (auto, nccl, mpi, mpi_nccl_rules)");
  require(p.backend != "nccl" || t.device == "cuda",
          "parallel.backend: nccl moves GPU tensors; set train.device: cuda (or parallel.backend: "
          "mpi)");
  validate_pipeline_config(c);
  validate_model_parallel_config(c);
  validate_sdp_config(c);
  parallel::diloco::validate(p.diloco, {p.dp * p.pp * p.cp * p.tp, t.steps, p.sdp.on()});
  if (!p.diloco.on()) {
    const std::string keys = non_default_keys(c, "parallel.diloco");
    require(keys.empty(), keys + ": set, but parallel.diloco.islands is 0 (DiLoCo is off); set " +
                              "parallel.diloco.islands or remove the keys");
  }
  require(!p.diloco.on() || p.diloco.islands == 1 || !c.data.packing,
          "parallel.diloco: islands > 1 with data.packing is not supported yet (each island's "
          "packed steps would be weighted by every island's tokens)");
}

DType train_dtype(const std::string& name) {
  if (name == "f64") return DType::kF64;
  if (name == "bf16") return DType::kBF16;
  if (name == "f16") return DType::kF16;
  LOOM_CHECK(name == "f32", "train_dtype: '", name, "' is not f64, f32, bf16 or f16");
  return DType::kF32;
}

int64_t pipeline_microbatches(const Config& c) {
  return c.parallel.microbatches > 0 ? c.parallel.microbatches : c.optim.grad_accum;
}

int64_t global_batch_sequences(const Config& c) {
  const int64_t micro = c.parallel.pp > 1 ? pipeline_microbatches(c) : c.optim.grad_accum;
  return c.data.batch_size * c.parallel.dp * micro;
}

int64_t ramp_micro_batches(const Config& c, int64_t step) {
  const int64_t M = c.optim.grad_accum, S = c.train.batch_ramp_start, R = c.train.batch_ramp_steps;
  if (R <= 0 || step > R) return M;
  return std::min(M, S + (M - S) * (step - 1) / R);
}

bool uses_nccl(const Config& c) {
  return c.parallel.backend == "nccl" || (c.parallel.backend == "auto" && c.train.device == "cuda");
}

namespace {
void flatten_into(const YAML::Node& node, const std::string& key,
                  std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node)
      flatten_into(kv.second, (key.empty() ? "" : key + ".") + kv.first.as<std::string>(), out);
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  out[key] = e.c_str();
}
}  // namespace

std::map<std::string, std::string> flatten_config(const std::string& yaml) {
  std::map<std::string, std::string> out;
  const YAML::Node root = YAML::Load(yaml.empty() ? "{}" : yaml);
  if (root.IsMap()) flatten_into(root, "", out);
  return out;
}

Config parse_config_text(const std::string& text, const std::vector<std::string>& overrides) {
  const YamlDocument doc = parse_yaml_document(text);  // one document, no repeated key
  if (!doc.ok()) throw ConfigError("config: " + doc.error);
  return from_node(doc.root, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const YamlDocument doc = load_yaml_document(path, "config file");
  if (!doc.ok()) throw ConfigError(path + ": " + doc.error);
  try {
    return from_node(doc.root, overrides);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

std::string config_to_yaml(const Config& c) {
  Config copy = c;
  YAML::Emitter out;
  out << YAML::BeginMap;
  Writer w{out, ""};
  visit_fields(copy, w);
  if (w.current.find('.') != std::string::npos) out << YAML::EndMap;  // the nested section
  out << YAML::EndMap << YAML::EndMap;
  return out.c_str();
}

}  // namespace loom
