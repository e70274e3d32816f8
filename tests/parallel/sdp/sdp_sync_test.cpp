// tests/parallel/sdp/sdp_sync_test.cpp — sdp_slices (parallel/sdp/sdp_sync.h, Note [SDP gradient
// slices]) in one process: over the N workers of a cover, every id names the same slice with the
// same holders on every worker that lists it, exactly its holders list it, each view holds the
// units of its slice (the packed weights' rows/columns equal the full model's rows/columns of
// those units, since packing keeps the full init's values), ids run in reverse block order, and
// every other parameter is one slice held by all. The sync itself is tested under mpirun
// (tests/train/train_sdp_mpi_test.cpp).
#include "parallel/sdp/sdp_sync.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/ops/view.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "parallel/sdp/forward_masking.h"
#include "tests/layers/tiny_models.h"

namespace loom::parallel::sdp {
namespace {

struct Listed {
  std::vector<int> holders;
  std::string param;
  int64_t length = 0;
  std::set<int> listed_by;
};

void check_slices(const ModelConfig& mc, int workers, int k, uint64_t seed) {
  CoverOptions o;
  o.workers = workers;
  o.coverage = static_cast<double>(k) / workers;
  o.seed = seed;
  const NeuronAssignment cover = assign_neurons(
      o, std::vector<int64_t>(static_cast<size_t>(mc.n_layer), mc.ffn_hidden_size()));
  Transformer full(mc, DType::kF64, Device{}, LayerContext{});
  Generator g0(42);
  full.init_weights(g0);
  std::map<std::string, Tensor> full_params;
  for (auto& [name, p] : full.named_parameters()) full_params[name] = p;

  std::map<int64_t, Listed> by_id;
  for (int w = 0; w < workers; ++w) {
    Transformer m(mc, DType::kF64, Device{}, forward_masking_context(cover, w));
    Generator gen(42);
    m.init_weights(gen);
    const auto params = m.named_parameters();
    const std::vector<SdpSliceSpec> specs = sdp_slices(cover, w, params);
    int64_t last = -1, last_block = mc.n_layer;
    size_t replicated = 0;
    for (const SdpSliceSpec& s : specs) {
      EXPECT_GT(s.id, last) << "ids ascending and distinct";
      last = s.id;
      const std::string& name = params[s.param].first;
      Listed& l = by_id[s.id];
      if (l.listed_by.empty()) {
        l = {s.holders, name, s.length, {}};
      } else {
        EXPECT_EQ(l.holders, s.holders) << "id " << s.id;
        EXPECT_EQ(l.param, name) << "id " << s.id;
        EXPECT_EQ(l.length, s.length) << "id " << s.id;
      }
      l.listed_by.insert(w);
      if (s.length < 0) {  // replicated: whole, held by all, after every packed slice
        ++replicated;
        EXPECT_EQ(static_cast<int>(s.holders.size()), workers) << name;
        last_block = -1;
        continue;
      }
      EXPECT_GE(last_block, 0) << name << ": a packed slice after a replicated one";
      const int64_t block = std::stoll(name.substr(7, name.find('.', 7) - 7));
      EXPECT_LE(block, last_block) << name << ": blocks in reverse order";
      last_block = block;
      // The slice of the cover with these holders and size whose units the view holds.
      const Tensor view =
          ops::narrow(params[s.param].second, s.dim, s.local_begin, s.length).contiguous();
      bool matched = false;
      for (const UnitSlice& us : cover.layers[static_cast<size_t>(block)].slices) {
        if (us.holders != s.holders || us.size() != s.length) continue;
        const Tensor want =
            ops::narrow(full_params.at(name), s.dim, us.begin, us.size()).contiguous();
        if (want.to_vector() == view.to_vector()) matched = true;
      }
      EXPECT_TRUE(matched) << name << " worker " << w << " id " << s.id;
    }
    size_t whole = 0;
    for (const auto& [name, p] : params)
      if (p.placement().split_over(kAxisSdp) == nullptr) ++whole;
    EXPECT_EQ(replicated, whole);
  }
  for (const auto& [id, l] : by_id) {
    EXPECT_EQ(std::vector<int>(l.listed_by.begin(), l.listed_by.end()), l.holders)
        << "id " << id << " (" << l.param << ") is listed by exactly its holders";
    if (l.length >= 0) {
      EXPECT_EQ(static_cast<int>(l.holders.size()), k) << "id " << id;
    }
  }
}

TEST(SdpSlices, EveryIdIsOneSliceListedByExactlyItsHoldersGpt2) {
  check_slices(testing::tiny_gpt2(), 4, 2, 3);
  check_slices(testing::tiny_gpt2(), 4, 3, 9);
  check_slices(testing::tiny_gpt2(), 8, 2, 11);
}

TEST(SdpSlices, EveryIdIsOneSliceListedByExactlyItsHoldersLlama) {
  check_slices(testing::tiny_llama(), 4, 2, 3);
  check_slices(testing::tiny_llama(), 6, 3, 13);
}

TEST(SdpSlices, CoverageOneHoldsEverySliceOnEveryWorker) {
  check_slices(testing::tiny_gpt2(), 3, 3, 1);
}

}  // namespace
}  // namespace loom::parallel::sdp
