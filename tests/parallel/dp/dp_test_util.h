// tests/parallel/dp/dp_test_util.h — shared pieces of the data-parallel tests: the tiny GPT, the
// fixed global batches, the single-process reference run (computed inside every rank, no
// files), the same training under DataParallel on this rank's rows, and the layouts
// (dp size, MiCS partition) that fit the world size, and the comparisons of a run with the
// reference and of the replicas with each other. Tests only.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/decay_rule.h"
#include "parallel/dp/data_parallel.h"
#include "parallel/parallel_context.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel::testing {

constexpr int64_t kGlobalBatch = 8;  // rows per step, split over dp (and micro-batches)
constexpr int64_t kSeqLen = 16;
constexpr uint64_t kInitSeed = 1234;
constexpr double kLr = 3e-3;
constexpr double kMaxNorm = 1.0;

inline ModelConfig dp_tiny_gpt() {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 64;
  c.vocab_multiple = 32;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.max_seq_len = 16;
  return c;
}

// AdamW as every equivalence test runs it (eps 1e-6: Note [Equivalence tolerance] in
// tests/parallel/dp/dp_equivalence_mpi_test.cpp).
inline std::unique_ptr<optim::AdamW> make_adamw(std::vector<optim::ParamRef> refs) {
  return std::make_unique<optim::AdamW>(std::move(refs), 0.9, 0.95, 1e-6, 0.1);
}

inline DataParallelConfig dp_config(int zero_stage, size_t bucket_bytes) {
  DataParallelConfig c;
  c.zero_stage = zero_stage;
  c.bucket_bytes = bucket_bytes;
  c.optimizer = [](std::vector<optim::ParamRef> refs) -> std::unique_ptr<optim::Optimizer> {
    return make_adamw(std::move(refs));
  };
  c.decay_rule = optim::DecayRule::kDefault;
  return c;
}

// The global gradient norm of the engine's owned pieces (parallel/gradients.h), then the
// optimizer step clipped to kMaxNorm on the device; returns the norm before clipping.
inline double clip_and_step(DataParallel& dp, const ParallelContext& ctx, double lr) {
  const std::vector<HeldPiece> pieces = dp.grad_pieces();
  const Device device = pieces.empty() ? Device::cpu() : pieces.front().values.device();
  const Tensor sq = global_grad_sq_sum(pieces, &ctx, device);
  const double norm = std::sqrt(sq.item());
  dp.step_scaled(lr, optim::clip_scale_tensor(sq, kMaxNorm));
  return norm;
}

// The global batch of `step`: ids and targets (B, T) i32, identical on every rank.
inline std::pair<Tensor, Tensor> global_batch(int step) {
  Generator gen(777 + static_cast<uint64_t>(step));
  Tensor ids = randint({kGlobalBatch, kSeqLen}, 0, 64, gen, DType::kI32);
  Tensor targets = randint({kGlobalBatch, kSeqLen}, 0, 64, gen, DType::kI32);
  return {ids, targets};
}

struct RunResult {
  std::vector<double> losses;                          // global mean loss per step
  std::vector<double> norms;                           // gradient norm before clipping, per step
  std::vector<std::pair<std::string, Tensor>> params;  // after the last step
};

// The single-process run: the full batch, plain AdamW, optim::clip_grad_norm.
// A run against the reference: losses within loss_rel and norms within norm_rel (relative) at
// every step, every parameter within param_abs (absolute; NaN counts as the worst).
inline void expect_equivalent(const RunResult& ref, const RunResult& got, double loss_rel,
                              double norm_rel, double param_abs) {
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], loss_rel * std::abs(ref.losses[s]))
        << "loss of step " << s;
    EXPECT_NEAR(got.norms[s], ref.norms[s], norm_rel * std::abs(ref.norms[s]))
        << "gradient norm of step " << s;
  }
  ASSERT_EQ(ref.params.size(), got.params.size());
  double worst = 0.0;
  std::string worst_name;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    ASSERT_EQ(ref.params[i].first, got.params[i].first);
    const std::vector<double> a = ref.params[i].second.to_vector();
    const std::vector<double> b = got.params[i].second.to_vector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      if (!(std::abs(a[k] - b[k]) <= worst)) {  // NaN counts as the worst
        worst = std::isnan(b[k]) ? INFINITY : std::abs(a[k] - b[k]);
        worst_name = ref.params[i].first;
      }
    }
  }
  EXPECT_LE(worst, param_abs) << "largest parameter difference, in " << worst_name;
}

// Every data-parallel replica holds identical parameters, bit for bit. Collective over dp.
inline void expect_replicas_agree(const ParallelContext& ctx, const RunResult& got) {
  for (const auto& [name, p] : got.params) {
    const Tensor h = Tensor::from_vector<int64_t>({bits_hash(p)}, {1});
    Tensor all = Tensor::zeros({ctx.dp_size()}, DType::kI64);
    ctx.dp().all_gather(h, all);
    for (int r = 0; r < ctx.dp_size(); ++r)
      EXPECT_EQ(all.data<int64_t>()[r], h.data<int64_t>()[0])
          << name << " differs on dp rank " << r;
  }
}

inline RunResult reference_run(int steps) {
  Transformer model(dp_tiny_gpt());
  Generator gen(kInitSeed);
  model.init_weights(gen);
  const DataParallelConfig c = dp_config(0, 1);
  std::unique_ptr<optim::AdamW> adamw =
      make_adamw(optim::make_param_refs(model.named_parameters(), c.decay_rule));
  optim::AdamW& opt = *adamw;
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    auto [ids, targets] = global_batch(s);
    model.zero_grad();
    Tensor loss = model.loss(ids, targets);
    autograd::backward(loss);
    r.losses.push_back(loss.item());
    std::vector<Tensor> grads;
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
    r.norms.push_back(optim::clip_grad_norm(grads, kMaxNorm));
    opt.step(kLr);
  }
  for (auto& [name, p] : model.named_parameters()) r.params.emplace_back(name, p.clone());
  return r;
}

// The engine for `model`: from parameter units with the model's hooks installed at ZeRO-3
// (Note [ZeRO-3] in parallel/dp/data_parallel.h), else from the flat parameter list.
inline std::unique_ptr<DataParallel> make_dp(Transformer& model, Communicator& comm,
                                             const DataParallelConfig& config,
                                             MicsGroups groups = {}) {
  // dp_layout puts independent whole-model replicas along pp: say so (Note [Placement]), so
  // the global gradient norm counts one of them.
  mark_replicated(model.parameters(), kAxisPp);
  if (config.zero_stage < 3) {
    return std::make_unique<DataParallel>(model.named_parameters(), comm, config, groups);
  }
  auto dp = std::make_unique<DataParallel>(model.parameter_units(), comm, config, groups);
  model.set_unit_hooks(dp->unit_hooks());
  return dp;
}

// The same training under DataParallel: this rank takes rows [r·B/dp, (r+1)·B/dp) of each
// global batch, split further into `micro` accumulation micro-batches. With `checkpointing`
// every block recomputes its forward in backward.
inline RunResult dp_run(const ParallelContext& ctx, const DataParallelConfig& config, bool mics,
                        int steps, int micro, bool checkpointing = false) {
  ModelConfig mc = dp_tiny_gpt();
  mc.recompute = checkpointing ? "full" : "none";
  Transformer model(mc);
  Generator gen(kInitSeed);
  model.init_weights(gen);
  MicsGroups groups;
  if (mics) groups = {&ctx.group({kAxisMicsPartition}), &ctx.group({kAxisMicsReplica})};
  std::unique_ptr<DataParallel> engine = make_dp(model, ctx.dp(), config, groups);
  DataParallel& dp = *engine;
  const int64_t rows = kGlobalBatch / ctx.dp_size() / micro;
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    auto [ids, targets] = global_batch(s);
    dp.zero_grad();
    double local = 0.0;
    for (int m = 0; m < micro; ++m) {
      const int64_t row0 = (ctx.dp_rank() * micro + m) * rows;
      dp.set_sync(m == micro - 1);
      Tensor loss = model.loss(ids.narrow(0, row0, rows).contiguous(),
                               targets.narrow(0, row0, rows).contiguous());
      local += loss.item() / micro;
      autograd::backward(ops::scale(loss, 1.0 / micro));
    }
    dp.finish_gradient_sync();
    r.norms.push_back(clip_and_step(dp, ctx, kLr));
    Tensor l = Tensor::full({1}, local, DType::kF64);
    ctx.dp().all_reduce(l, ReduceOp::kAvg);
    r.losses.push_back(l.item());
  }
  r.params = dp.full_parameters();  // collective at ZeRO-3 (the parameters are sharded)
  model.set_unit_hooks(nullptr);
  return r;
}

// A layout with a dp group of `dp` ranks (the rest of the world along pp, unused here), and
// MiCS partitions of `mics_partition` ranks (0: none).
inline ParallelOptions dp_layout(int world, int dp, int mics_partition, double timeout_s) {
  ParallelOptions o;
  o.shape = {.dp = dp, .pp = world / dp, .cp = 1, .tp = 1};
  o.mics_partition_size = mics_partition;
  o.comm_timeout_s = timeout_s;
  return o;
}

}  // namespace loom::parallel::testing
