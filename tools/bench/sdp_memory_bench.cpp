// tools/bench/sdp_memory_bench.cpp — memory per worker of SDP forward masking (issue 19,
// docs/parallel.md "SDP") against plain data parallelism, measured from the tensors: the same
// GPT-2 built by the training plan (train/plan.h) as DDP (ZeRO 0) and as SDP at coverage 1/2
// and 1/4 over the N = world ranks (1/4 from 8 ranks: every slice needs two holders), one AdamW
// step each on random tokens, and per worker
//   params   Σ bytes of the parameters the rank trains,
//   grads    Σ bytes of their gradients after finalize_gradients,
//   optim    Σ bytes of the optimizer state (AdamW m and v),
//   peak     the CPU allocator's peak live bytes during the second step above the bytes live at
//            its start (activations and the step's transients),
// and the element count against the formula of docs/parallel.md, Ψ_o = Ψ_r + C·Ψ_s (Ψ_s: the
// full model's packed MLP elements — fc weight and bias, proj weight —, Ψ_r the rest). A
// measurement, not a test: run under mpirun, e.g.
//   OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe build/bin/sdp_memory_bench [--layers 4]
//       [--embd 128] [--vocab 50257] [--batch 8] [--seq 64]
// (the defaults are configs/gpt2-tiny.yaml's model and batch). Rank 0 prints one row per way:
// the largest value over the workers (workers' shares differ by at most a slice's units).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "parallel/launcher.h"
#include "parallel/parallel_context.h"
#include "parallel/sdp/packed_layers.h"
#include "train/config.h"
#include "train/plan.h"

namespace {

using namespace loom;
using namespace loom::parallel;

struct Args {
  int64_t layers = 4, embd = 128, vocab = 50257, batch = 8, seq = 64;
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
    else
      LOOM_FAIL("sdp_memory_bench: unknown argument ", k,
                " (--layers --embd --vocab --batch --seq)");
  }
  return a;
}

std::string yaml(const Args& a, int dp, double coverage) {
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: " << a.vocab << ", n_layer: " << a.layers
    << ", n_head: 4, n_embd: " << a.embd << ", max_seq_len: " << a.seq << "}\n"
    << "data: {train: unused_*.bin, batch_size: " << a.batch << ", seq_len: " << a.seq << "}\n"
    << "optim: {name: adamw, lr: 1.0e-3}\n"
    << "train: {steps: 2, log_every: 1000, val_every: 0, sample_every: 0}\n"
    << "checkpoint: {every: 0, keep: 0, at_end: false}\n"
    << "logging: {jsonl: false, tensorboard: false}\n"
    << "parallel: {dp: " << dp << ", zero_stage: 0";
  if (coverage > 0) y << ", sdp: {mode: forward, coverage: " << coverage << ", seed: 1}";
  y << "}\n";
  return y.str();
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
  double params = 0, grads = 0, optim = 0, peak = 0, elements = 0, formula = 0;
};

// One way (coverage 0: DDP): the per-worker numbers, the largest over the workers.
Row measure(const Args& a, double coverage, ParallelContext& ctx) {
  const Config cfg = parse_config_text(yaml(a, ctx.world_size(), coverage));
  Allocator& al = allocator_for(DeviceType::kCpu);
  TrainPlan plan = build_plan(cfg, &ctx, Device{}, PlanHooks{});
  Generator gen(100 + static_cast<uint64_t>(ctx.rank()));
  const Tensor ids = randint({a.batch, a.seq}, 0, a.vocab, gen, DType::kI32);
  const Tensor targets = randint({a.batch, a.seq}, 0, a.vocab, gen, DType::kI32);
  Row r;
  for (int step = 0; step < 2; ++step) {  // the second step measured (optimizer state exists)
    const int64_t start = al.stats().current_bytes;
    al.reset_peak();
    plan.zero_grad();
    autograd::backward(plan.model->loss(ids, targets));
    plan.finalize_gradients();
    r.grads = static_cast<double>(bytes_of(plan.trained(), true));
    plan.step(1e-3, Tensor());
    r.peak = static_cast<double>(al.stats().peak_bytes - start);
  }
  const auto trained = plan.trained();
  r.params = static_cast<double>(bytes_of(trained, false));
  r.optim = static_cast<double>(bytes_of(plan.optimizer_state(), false));
  // Ψ_s from the full model's elements of the parameters SDP packs (split over 'sdp' here).
  int64_t elements = 0, packed_full = 0, total_full = 0;
  Transformer full(cfg.model, DType::kF32, Device{}, LayerContext{});
  std::map<std::string, int64_t> full_numel;
  for (const auto& [name, p] : full.named_parameters()) {
    full_numel[name] = p.numel();
    total_full += p.numel();
  }
  for (const auto& [name, p] : trained) {
    elements += p.numel();
    if (p.placement().split_over(sdp::kAxisSdp) != nullptr) packed_full += full_numel.at(name);
  }
  const double c = coverage > 0 ? coverage : 1.0;
  r.elements = static_cast<double>(elements);
  r.formula = static_cast<double>(total_full - packed_full) + c * static_cast<double>(packed_full);
  Tensor v = Tensor::from_vector(
      std::vector<double>{r.params, r.grads, r.optim, r.peak, r.elements, r.formula}, {6});
  ctx.world().all_reduce(v, ReduceOp::kMax);
  const std::vector<double> m = v.to_vector();
  return {m[0], m[1], m[2], m[3], m[4], m[5]};
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
    if (ctx.rank() == 0) {
      std::printf(
          "GPT-2 %lld layers, n_embd %lld, vocab %lld; batch %lld x %lld per worker; "
          "%d workers; f32, AdamW. MiB per worker (max over workers)\n",
          static_cast<long long>(a.layers), static_cast<long long>(a.embd),
          static_cast<long long>(a.vocab), static_cast<long long>(a.batch),
          static_cast<long long>(a.seq), ctx.world_size());
      std::printf("%-10s %10s %10s %10s %12s %14s %14s %9s\n", "way", "params", "grads", "optim",
                  "step peak", "elements", "Psi_r+C*Psi_s", "vs DDP");
    }
    double ddp_state = 0;
    for (double coverage : {0.0, 0.5, 0.25}) {
      if (coverage > 0 && coverage * ctx.world_size() < 2) {  // one holder: refused (assignment.h)
        if (ctx.rank() == 0)
          std::printf("SDP C=%.2f needs %d workers or more (two holders per slice)\n", coverage,
                      static_cast<int>(2 / coverage));
        continue;
      }
      const Row r = measure(a, coverage, ctx);
      const double state = r.params + r.grads + r.optim;
      if (coverage == 0) ddp_state = state;
      if (ctx.rank() == 0) {
        const std::string way =
            coverage == 0 ? "DDP" : "SDP C=" + std::to_string(coverage).substr(0, 4);
        std::printf("%-10s %10.2f %10.2f %10.2f %12.2f %14.0f %14.0f %8.3fx\n", way.c_str(),
                    mib(r.params), mib(r.grads), mib(r.optim), mib(r.peak), r.elements, r.formula,
                    state / ddp_state);
      }
    }
    return 0;
  });
}
