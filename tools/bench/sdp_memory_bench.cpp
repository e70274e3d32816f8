// tools/bench/sdp_memory_bench.cpp — memory per worker of every SDP regime and level
// (docs/parallel.md "SDP", parallel.sdp: {mode: forward|backward, level: neuron|block}) against
// plain data parallelism, measured from the tensors: the same GPT-2 built by the training plan
// (train/plan.h, Note [SDP plan]) as DDP (ZeRO 0) and, at coverage C = 1/2 and 1/4 over the N =
// world ranks, as forward-neuron, backward-neuron, forward-block and backward-block SDP, and at the
// neuron level with the heads option too (parallel.sdp.heads: each block's KV groups covered,
// "forward-neuron+heads", "backward-neuron+heads"; n_head ≥ N needed, --n_head); two AdamW
// steps each on random tokens, the second measured, and per worker
//   params   Σ bytes of every tensor the worker holds of the model, each once: the model's
//            parameters (at the block level under backward masking the unheld blocks too, frozen:
//            requires_grad false) and neuron backward masking's frozen copies (SdpSync::frozen());
//   grads    Σ bytes of the trained parameters' gradients after the engine's finish();
//   optim    Σ bytes of the optimizer state (AdamW m and v);
//   peak     the CPU allocator's peak live bytes during the second step above the bytes live at
//            its start (activations and the step's transients, backward masking's publication);
// and the element counts against the formulas of docs/parallel.md: trained Ψ_o = Ψ_r + C·Ψ_s,
// held Ψ_o (forward masking) or Ψ (backward), where Ψ_s is the full model's split elements —
// neuron level: the blocks' MLP parameters indexed by a hidden unit (fc weight and bias, proj
// weight; gate/up/down for llama) and, with heads, the attention's qkv weight and bias and proj
// weight; block level: every "blocks.*" parameter — and Ψ_r = Ψ − Ψ_s.
// Ways the cover refuses (C·N < 2; at the block level C·n_layer not whole or < 2; heads with
// n_head < N) get a line saying why. A measurement, not a test: run under mpirun, e.g.
//   OMP_NUM_THREADS=1 mpirun -np 8 --oversubscribe build/bin/sdp_memory_bench [--layers 4]
//       [--embd 128] [--vocab 50257] [--batch 8] [--seq 64] [--n_head 4]
// (the defaults are configs/gpt2-tiny.yaml's model and batch; n_head changes no parameter count,
// only the attention's activations, so the heads rows at 8 ranks take --n_head 8). Rank 0 prints
// one row per way: the largest value over the workers (workers' shares differ by at most a slice's
// units), and whether every worker's counts equal the formulas exactly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "parallel/launcher.h"
#include "parallel/parallel_context.h"
#include "parallel/sdp/neuron_masking.h"
#include "parallel/sdp/sdp_sync.h"
#include "train/config.h"
#include "train/plan.h"

namespace {

using namespace loom;
using namespace loom::parallel;

struct Args {
  int64_t layers = 4, embd = 128, vocab = 50257, batch = 8, seq = 64, n_head = 4;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atol(argv[i + 1]);
    if (k == "--layers")
      a.layers = v;
    else if (k == "--embd")
      a.embd = v;
    else if (k == "--vocab")
      a.vocab = v;
    else if (k == "--batch")
      a.batch = v;
    else if (k == "--seq")
      a.seq = v;
    else if (k == "--n_head")
      a.n_head = v;
    else
      LOOM_FAIL("sdp_memory_bench: unknown argument ", k,
                " (--layers --embd --vocab --batch --seq --n_head)");
  }
  return a;
}

// One way of training: DDP (coverage 0) or SDP with its regime and level (and, at the neuron
// level, whether the attention's KV groups are covered too).
struct Way {
  std::string mode = "none", level = "neuron";
  double coverage = 0;
  bool heads = false;
  bool sdp() const { return coverage > 0; }
  bool forward() const { return mode == "forward"; }
  bool block() const { return level == "block"; }
  std::string name() const {
    if (!sdp()) return "DDP";
    return mode + "-" + level + (heads ? "+heads" : "") + " C=1/" +
           std::to_string(std::lround(1 / coverage));
  }
};

std::string yaml(const Args& a, int dp, const Way& w) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: " << a.vocab << ", n_layer: " << a.layers
    << ", n_head: " << a.n_head << ", n_embd: " << a.embd << ", max_seq_len: " << a.seq << "}\n"
    << "data: {train: unused_*.bin, batch_size: " << a.batch << ", seq_len: " << a.seq << "}\n"
    << "optim: {name: adamw, lr: 1.0e-3}\n"
    << "train: {steps: 2, log_every: 1000, val_every: 0, sample_every: 0}\n"
    << "checkpoint: {every: 0, keep: 0, at_end: false}\n"
    << "logging: {jsonl: false, tensorboard: false}\n"
    << "parallel: {dp: " << dp << ", zero_stage: 0";
  if (w.sdp())
    y << ", sdp: {mode: " << w.mode << ", level: " << w.level << ", coverage: " << w.coverage
      << ", seed: 1" << (w.heads ? ", heads: true" : "") << "}";
  y << "}\n";
  return y.str();
}

// Why the cover refuses `w` on `workers` ranks ("" if it does not; assignment.h).
std::string refusal(const Way& w, int workers, int64_t n_layer, int64_t n_head) {
  if (!w.sdp()) return "";
  const double k = w.coverage * workers;
  if (k < 2 || k != std::floor(k))
    return "C*N = " + std::to_string(k) + ": every slice needs a whole number >= 2 of holders";
  if (w.heads && n_head < workers)
    return "n_head (= n_kv_head) " + std::to_string(n_head) + " < N = " + std::to_string(workers) +
           ": every worker needs a KV group of each block (--n_head)";
  if (w.block()) {
    const double blocks = w.coverage * static_cast<double>(n_layer);
    if (blocks != std::floor(blocks))
      return "C*n_layer = " + std::to_string(blocks) + " blocks per worker is not whole";
    if (blocks < 2)
      return "C*n_layer = " + std::to_string(static_cast<int64_t>(blocks)) +
             " block per worker: the holder graph is not connected (every worker needs two "
             "blocks or more)";
  }
  return "";
}

// Whether a full-model parameter is split over the hidden units at the neuron level: the MLP's
// weights indexed by a hidden unit (rows of fc/gate/up and their biases, columns of proj/down).
bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool neuron_split(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0 || name.find(".mlp.") == std::string::npos) return false;
  for (const char* s : {".fc.weight", ".fc.bias", ".gate.weight", ".gate.bias", ".up.weight",
                        ".up.bias", ".proj.weight", ".down.weight"})
    if (ends_with(name, s)) return true;
  return false;
}
// Whether a full-model parameter is split over the KV groups by the heads option: the
// attention's qkv rows (weight and bias) and proj columns (the proj bias stays whole).
bool head_split(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return false;
  for (const char* s : {".attn.qkv.weight", ".attn.qkv.bias", ".attn.proj.weight"})
    if (ends_with(name, s)) return true;
  return false;
}

// The full model's element counts: Ψ and the split Ψ_s of each level (the heads option's
// attention part apart: Ψ_s of neuron+heads is neuron_split + head_split).
struct Full {
  int64_t total = 0, neuron_split = 0, head_split = 0, block_split = 0;
  std::map<std::string, int64_t> numel;
};

Full full_model(const Config& cfg) {
  Full f;
  Transformer full(cfg.model, DType::kF32, Device{}, LayerContext{});
  for (const auto& [name, p] : full.named_parameters()) {
    f.numel[name] = p.numel();
    f.total += p.numel();
    if (neuron_split(name)) f.neuron_split += p.numel();
    if (head_split(name)) f.head_split += p.numel();
    if (name.rfind("blocks.", 0) == 0) f.block_split += p.numel();
  }
  return f;
}

int64_t bytes_of(const std::vector<std::pair<std::string, Tensor>>& ts, bool grads) {
  int64_t b = 0;
  for (const auto& [name, t] : ts) {
    const Tensor x = grads ? t.grad() : t;
    if (x.defined()) b += static_cast<int64_t>(x.nbytes());
  }
  return b;
}

struct Row {
  double params = 0, grads = 0, optim = 0, peak = 0;
  double trained = 0, trained_formula = 0, held = 0, held_formula = 0;
  double mismatch = 0;  // over the workers: the largest |measured − formula| (elements)
};

// One way: the per-worker numbers, the largest over the workers.
Row measure(const Args& a, const Way& w, const Full& full, ParallelContext& ctx) {
  const Config cfg = parse_config_text(yaml(a, ctx.world_size(), w));
  Allocator& al = allocator_for(DeviceType::kCpu);
  TrainPlan plan = build_plan(cfg, &ctx, Device{}, PlanHooks{});
  const bool sdp = plan.engine->describe().rfind("sdp:", 0) == 0;  // SdpEngine's line
  LOOM_CHECK(w.sdp() == sdp, "sdp_memory_bench: ", w.name(), " built the wrong plan");
  Generator gen(100 + static_cast<uint64_t>(ctx.rank()));
  const Tensor ids = randint({a.batch, a.seq}, 0, a.vocab, gen, DType::kI32);
  const Tensor targets = randint({a.batch, a.seq}, 0, a.vocab, gen, DType::kI32);
  Row r;
  for (int step = 0; step < 2; ++step) {  // the second step measured (optimizer state exists)
    const int64_t start = al.stats().current_bytes;
    al.reset_peak();
    plan.engine->zero_grad();
    plan.engine->begin_micro_batch(0, 1);
    autograd::backward(plan.model->loss(ids, targets));
    plan.engine->finish();
    r.grads = static_cast<double>(bytes_of(plan.trained(), true));
    plan.engine->step(1e-3, Tensor());
    r.peak = static_cast<double>(al.stats().peak_bytes - start);
  }
  // Held: the model's parameters and the frozen copies, each tensor once (at the block level the
  // frozen blocks are model parameters; at the neuron level extra tensors).
  std::vector<std::pair<std::string, Tensor>> held = plan.model->named_parameters();
  for (const HeldPiece& p : plan.engine->held_parameters()) held.emplace_back(p.param, p.values);
  std::unordered_set<const void*> seen;
  int64_t held_bytes = 0, held_elements = 0;
  for (const auto& [name, t] : held) {
    if (!seen.insert(t.impl()).second) continue;
    held_bytes += static_cast<int64_t>(t.nbytes());
    held_elements += t.numel();
  }
  r.params = static_cast<double>(held_bytes);
  r.optim = static_cast<double>(bytes_of(plan.engine->optimizer_state(), false));
  int64_t trained = 0;
  for (const auto& [name, p] : plan.trained()) {
    trained += p.numel();
    // At the neuron level the parameters SdpSync splits over 'sdp' are the ones counted in Ψ_s.
    if (w.sdp() && !w.block())
      LOOM_CHECK((neuron_split(name) || (w.heads && head_split(name))) ==
                     (p.placement().split_over(sdp::kAxisSdp) != nullptr),
                 "sdp_memory_bench: ", name, " split over 'sdp' differs from Ψ_s's parameters");
  }
  const double c = w.sdp() ? w.coverage : 1.0;
  const double split = static_cast<double>(w.block() ? full.block_split
                                           : w.heads ? full.neuron_split + full.head_split
                                                     : full.neuron_split);
  r.trained = static_cast<double>(trained);
  r.trained_formula = static_cast<double>(full.total) - split + c * split;
  r.held = static_cast<double>(held_elements);
  r.held_formula = w.sdp() && !w.forward() ? static_cast<double>(full.total) : r.trained_formula;
  r.mismatch = std::max(std::abs(r.trained - r.trained_formula), std::abs(r.held - r.held_formula));
  Tensor v = Tensor::from_vector(
      std::vector<double>{r.params, r.grads, r.optim, r.peak, r.trained, r.trained_formula, r.held,
                          r.held_formula, r.mismatch},
      {9});
  ctx.world().all_reduce(v, ReduceOp::kMax);
  const std::vector<double> m = v.to_vector();
  return {m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8]};
}

double mib(double b) { return b / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  return run_main(argc, argv, [&](MpiRuntime& mpi) {
    if (mpi.size() < 2) {
      std::printf("sdp_memory_bench: run under mpirun with 2 or more ranks (dp = world size)\n");
      return 0;
    }
    ParallelOptions po;
    po.shape.dp = mpi.size();
    ParallelContext ctx = ParallelContext::create(po);
    const Full full = full_model(parse_config_text(yaml(a, ctx.world_size(), Way{})));
    if (ctx.rank() == 0) {
      std::printf(
          "GPT-2 %lld layers, n_embd %lld, vocab %lld, n_head %lld; batch %lld x %lld per worker; "
          "%d workers; f32, AdamW. MiB per worker (max over workers)\n"
          "Psi %lld; Psi_s neuron level %lld (with heads %lld), block level %lld\n",
          static_cast<long long>(a.layers), static_cast<long long>(a.embd),
          static_cast<long long>(a.vocab), static_cast<long long>(a.n_head),
          static_cast<long long>(a.batch), static_cast<long long>(a.seq), ctx.world_size(),
          static_cast<long long>(full.total), static_cast<long long>(full.neuron_split),
          static_cast<long long>(full.neuron_split + full.head_split),
          static_cast<long long>(full.block_split));
      std::printf("%-28s %8s %8s %8s %8s %7s %9s %10s %10s %10s %10s %6s\n", "way", "params",
                  "grads", "optim", "state", "vs DDP", "step peak", "trained", "Psi_o", "held",
                  "Psi_o|Psi", "exact");
    }
    std::vector<Way> ways{Way{}};
    for (double c : {0.5, 0.25}) {
      for (const char* level : {"neuron", "block"})
        for (const char* mode : {"forward", "backward"}) ways.push_back(Way{mode, level, c});
      for (const char* mode : {"forward", "backward"})
        ways.push_back(Way{mode, "neuron", c, /*heads=*/true});
    }
    double ddp_state = 0;
    for (const Way& w : ways) {
      const std::string why = refusal(w, ctx.world_size(), a.layers, a.n_head);
      if (!why.empty()) {
        if (ctx.rank() == 0) std::printf("%-28s refused: %s\n", w.name().c_str(), why.c_str());
        continue;
      }
      const Row r = measure(a, w, full, ctx);
      const double state = r.params + r.grads + r.optim;
      if (!w.sdp()) ddp_state = state;
      if (ctx.rank() == 0)
        std::printf("%-28s %8.2f %8.2f %8.2f %8.2f %6.3fx %9.2f %10.0f %10.0f %10.0f %10.0f %6s\n",
                    w.name().c_str(), mib(r.params), mib(r.grads), mib(r.optim), mib(state),
                    state / ddp_state, mib(r.peak), r.trained, r.trained_formula, r.held,
                    r.held_formula, r.mismatch == 0 ? "yes" : "NO");
    }
    return 0;
  });
}
