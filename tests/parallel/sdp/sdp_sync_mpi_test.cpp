// tests/parallel/sdp/sdp_sync_mpi_test.cpp — SdpSync's sync overlapped with backward
// (parallel/sdp/sdp_sync.h, Note [SDP overlapped sync]) under mpirun, proven from its event log
// and not from timings: the parameters' grad-ready hooks launch the last block's slices before
// block 0's gradients exist (so, with one slice per bucket and the last block's ids first
// in every holder set, its averages are issued while backward still runs); every slice is
// launched from a hook, once; with accumulation nothing is launched before the last
// micro-batch's backward; the gradients after finish() are bitwise those of the finish-only path
// (no hook launches: every slice launched by finish(), in ascending id) and the buffers stay the
// gradients' memory from step to step (no per-step copy); a further backward before finish() is
// an error naming the parameter. The trainer's numbers are checked in
// tests/train/train_sdp_mpi_test.cpp.
// loom-mpi-test: ranks 4 8
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/sdp/forward_masking.h"
#include "parallel/sdp/sdp_sync.h"
#include "tests/layers/tiny_models.h"
#include "tests/parallel/mpi_test_util.h"

namespace loom::parallel::sdp {
namespace {

using loom::testing::random_ids;
using loom::testing::tiny_gpt2;
using loom::testing::tiny_llama;
using testing::world_rank;
using testing::world_size;

struct StepRun {
  std::vector<SdpEvent> events;           // the last step's
  std::vector<std::string> names;         // parameter names
  std::vector<Tensor> grads;              // after finish()
  std::vector<const void*> grad_storage;  // per step: the first parameter's .grad memory
  int64_t slices = 0;
};

NeuronAssignment cover_for(const ModelConfig& mc, double coverage) {
  CoverOptions o;
  o.workers = world_size();
  o.coverage = coverage;
  o.seed = 3;
  return assign_neurons(
      o, std::vector<int64_t>(static_cast<size_t>(mc.n_layer), mc.ffn_hidden_size()));
}

// `steps` steps of `backwards` backwards each on this rank's batches, SdpSync told
// `micro_batches` (more than `backwards`: no hook launches, the finish-only path).
StepRun run(const ModelConfig& mc, double coverage, int micro_batches, int backwards,
            int steps = 1) {
  auto dp = MpiCommunicator::duplicate(MPI_COMM_WORLD, "dp", testing::kTestCommTimeoutS);
  const NeuronAssignment cover = cover_for(mc, coverage);
  Transformer model(mc, DType::kF32, Device{}, forward_masking_context(cover, world_rank()));
  Generator gen(42);
  model.init_weights(gen);
  SliceSyncOptions so;
  so.bucket_bytes = 1;  // one slice per bucket: a launch of a set's lowest pending id issues it
  so.timeout_s = testing::kTestCommTimeoutS;
  const auto params = model.named_parameters();
  SdpSync sync(*dp, neuron_setup(cover, world_rank(), params), params, so, micro_batches);
  StepRun r;
  for (const auto& [name, p] : params) r.names.push_back(name);
  r.slices = static_cast<int64_t>(sync.slices().size());
  for (int step = 0; step < steps; ++step) {
    sync.zero_grad();
    for (int m = 0; m < backwards; ++m) {
      const uint64_t seed = 1000 + 100 * static_cast<uint64_t>(world_rank()) + 10 * step + m;
      const Tensor ids = random_ids(2, 8, mc.vocab_size, seed);
      const Tensor targets = random_ids(2, 8, mc.vocab_size, seed + 7);
      autograd::backward(model.loss(ids, targets));
    }
    r.events = sync.events();
    sync.finish();
    r.grad_storage.push_back(params.front().second.grad().storage().get());
  }
  for (const auto& [name, p] : params) r.grads.push_back(p.grad().clone());
  return r;
}

bool in_block(const std::string& name, int l) {
  return name.rfind("blocks." + std::to_string(l) + ".", 0) == 0;
}

// The overlap: a slice of the last block is launched before any hook of block 0 (the
// replicated parameters after the last block, ln_f and the head, launch even earlier, but their
// ids come last in their set); every slice is launched from a hook exactly once.
void expect_overlap(const ModelConfig& mc, const StepRun& r) {
  int64_t first_last_block_launch = -1, first_block0_hook = -1, launches = 0;
  for (size_t e = 0; e < r.events.size(); ++e) {
    const SdpEvent& ev = r.events[e];
    const std::string& name = r.names[ev.param];
    if (ev.kind == SdpEvent::Kind::kLaunch) {
      ++launches;
      if (first_last_block_launch < 0 && in_block(name, static_cast<int>(mc.n_layer) - 1))
        first_last_block_launch = static_cast<int64_t>(e);
    }
    if (ev.kind == SdpEvent::Kind::kHook && in_block(name, 0) && first_block0_hook < 0)
      first_block0_hook = static_cast<int64_t>(e);
  }
  ASSERT_GE(first_last_block_launch, 0) << "no slice of the last block launched from a hook";
  ASSERT_GE(first_block0_hook, 0);
  EXPECT_LT(first_last_block_launch, first_block0_hook)
      << "the last block's sync waited for block 0's backward";
  EXPECT_EQ(launches, r.slices);
}

void expect_same_grads(const StepRun& a, const StepRun& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(testing::same_bits(a.grads[i], b.grads[i])) << a.names[i];
}

TEST(SdpSyncOverlap, HooksLaunchTheLastBlockBeforeBlockZerosBackward) {
  for (const ModelConfig& mc : {tiny_gpt2(), tiny_llama()}) {
    for (double coverage : {0.5, 1.0}) {
      SCOPED_TRACE(mc.arch + " coverage " + std::to_string(coverage));
      const StepRun overlapped = run(mc, coverage, 1, 1);
      expect_overlap(mc, overlapped);
      const StepRun finish_only = run(mc, coverage, 2, 1);  // hooks never reach the count
      for (const SdpEvent& e : finish_only.events) {
        EXPECT_NE(e.kind, SdpEvent::Kind::kLaunch);
      }
      expect_same_grads(overlapped, finish_only);
    }
  }
}

TEST(SdpSyncOverlap, AccumulationLaunchesOnlyAtTheLastMicroBatch) {
  const ModelConfig mc = tiny_gpt2();
  const StepRun accumulated = run(mc, 0.5, 3, 3);
  // Each parameter's hook fires three times; no launch before its third firing.
  std::vector<int> fired(accumulated.names.size(), 0);
  for (const SdpEvent& e : accumulated.events) {
    if (e.kind == SdpEvent::Kind::kHook) ++fired[e.param];
    if (e.kind == SdpEvent::Kind::kLaunch) {
      EXPECT_EQ(fired[e.param], 3) << accumulated.names[e.param];
    }
  }
  // The last backward's events alone show the overlap.
  StepRun last = accumulated;
  size_t cut = 0;
  std::vector<int> seen(accumulated.names.size(), 0);
  for (size_t e = 0; e < accumulated.events.size(); ++e) {
    const SdpEvent& ev = accumulated.events[e];
    if (ev.kind == SdpEvent::Kind::kHook && ++seen[ev.param] == 3 && cut == 0) cut = e;
  }
  last.events.assign(accumulated.events.begin() + static_cast<std::ptrdiff_t>(cut),
                     accumulated.events.end());
  expect_overlap(mc, last);
  expect_same_grads(accumulated, run(mc, 0.5, 4, 3));
}

TEST(SdpSyncOverlap, BuffersStayTheGradientsAcrossSteps) {
  const StepRun r = run(tiny_gpt2(), 0.5, 1, 1, 3);
  ASSERT_EQ(r.grad_storage.size(), 3u);
  EXPECT_EQ(r.grad_storage[0], r.grad_storage[1]);
  EXPECT_EQ(r.grad_storage[1], r.grad_storage[2]);
  expect_overlap(tiny_gpt2(), r);  // the third step's log
}

TEST(SdpSyncOverlap, AnotherBackwardBeforeFinishIsAnError) {
  const ModelConfig mc = tiny_gpt2();
  auto dp = MpiCommunicator::duplicate(MPI_COMM_WORLD, "dp", testing::kTestCommTimeoutS);
  const NeuronAssignment cover = cover_for(mc, 0.5);
  Transformer model(mc, DType::kF32, Device{}, forward_masking_context(cover, world_rank()));
  Generator gen(42);
  model.init_weights(gen);
  SliceSyncOptions so;
  so.timeout_s = testing::kTestCommTimeoutS;
  const auto named = model.named_parameters();
  SdpSync sync(*dp, neuron_setup(cover, world_rank(), named), named, so, 1);
  sync.zero_grad();
  const Tensor ids = random_ids(2, 8, mc.vocab_size, 5 + static_cast<uint64_t>(world_rank()));
  autograd::backward(model.loss(ids, ids));
  try {
    autograd::backward(model.loss(ids, ids));
    ADD_FAILURE() << "a second backward in a one-micro-batch step was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("arrived 2 times"), std::string::npos) << e.what();
  }
  sync.finish();  // the first backward's launches complete on every rank
}

}  // namespace
}  // namespace loom::parallel::sdp
