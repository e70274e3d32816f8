// tests/data/step_source_test.cpp — the step sources (data/step_source.h): a window step is the
// loader's next micro-batches, in order, and resumes where the loader does; a packed step is the
// packed loader's, with the step's loss tokens and split; StepData's weights (1/M, c_m / N); the
// cut's log line.
#include "data/step_source.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/documents.h"
#include "data/shard.h"
#include "tests/data/data_test_util.h"

namespace loom {
namespace {

std::vector<int32_t> values(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return {p, p + t.numel()};
}

std::string window_shard(const data_test::TempDir& dir) {
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 500);
  const std::string path = dir.file("train_000000.bin");
  write_shard(path, tokens);
  return path;
}

TEST(StepSource, WindowStepIsTheLoadersNextBatches) {
  data_test::TempDir dir;
  const std::string path = window_shard(dir);
  DataLoader reference({path}, 4, 16, 1, 2, 7);
  WindowSource source(std::make_unique<DataLoader>(std::vector<std::string>{path}, 4, 16, 1, 2, 7),
                      3);
  for (int step = 0; step < 4; ++step) {
    const StepData d = source.next_step();
    EXPECT_EQ(d.loss, StepLoss::kMean);
    ASSERT_EQ(d.micro_batches(), 3);
    EXPECT_EQ(d.global_tokens, 3 * 4 * 16 * 2);  // every rank reads as many
    EXPECT_EQ(d.global_loss_tokens, d.global_tokens);
    EXPECT_TRUE(d.rank_tokens.empty());
    for (size_t m = 0; m < d.micro.size(); ++m) {
      const Batch b = reference.next();
      const MicroBatch& mb = d.micro[m];
      EXPECT_EQ(values(mb.inputs), values(b.inputs));
      EXPECT_EQ(values(mb.targets), values(b.targets));
      EXPECT_FALSE(mb.positions.defined());
      EXPECT_FALSE(mb.doc_start.defined());
      EXPECT_EQ(mb.loss_tokens, 4 * 16);
      EXPECT_EQ(d.weight(m), 1.0 / 3);
    }
    EXPECT_EQ(source.state(), reference.state());
  }
  EXPECT_EQ(source.fingerprint(), reference.fingerprint());
  EXPECT_EQ(source.summary(), "");
  // Resume: the next step after set_state is the one an uninterrupted source gives.
  const LoaderState at = source.state();
  const StepData want = source.next_step();
  WindowSource resumed(std::make_unique<DataLoader>(std::vector<std::string>{path}, 4, 16, 1, 2, 7),
                       3);
  resumed.set_state(at);
  const StepData got = resumed.next_step();
  for (size_t m = 0; m < want.micro.size(); ++m)
    EXPECT_EQ(values(got.micro[m].inputs), values(want.micro[m].inputs));
}

// Documents of 2 + (d % 9) tokens; a loss mask of 1 on every target of even documents only.
std::string document_shard(const data_test::TempDir& dir, int64_t count) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets = {0};
  for (int64_t d = 0; d < count; ++d) {
    const int64_t n = 2 + d % 9;
    for (int64_t t = 0; t < n; ++t) {
      tokens.push_back(static_cast<int32_t>((d * 5 + t) % 90 + 1));
      mask.push_back(t > 0 && d % 2 == 0 ? 1 : 0);
    }
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  const std::string path = dir.file("train_000000.bin");
  write_document_shard(path, tokens, mask, offsets);
  return path;
}

TEST(StepSource, PackedStepIsThePackedLoadersWithItsWeights) {
  data_test::TempDir dir;
  const std::string path = document_shard(dir, 60);
  PackingOptions o;
  o.docs_per_rank = 5;
  o.max_len = 6;  // documents of 8 or more tokens are cut
  o.max_tokens = 12;
  o.rank = 1;
  o.world_size = 2;
  o.seed = 3;
  PackedLoader reference({path}, o);
  PackedSource source(std::make_unique<PackedLoader>(std::vector<std::string>{path}, o));
  for (int step = 0; step < 5; ++step) {
    const PackedStep p = reference.next();
    const StepData d = source.next_step();
    EXPECT_EQ(d.loss, StepLoss::kTokens);
    EXPECT_EQ(d.global_loss_tokens, p.global_loss_tokens);
    EXPECT_EQ(d.global_tokens, p.global_tokens);
    EXPECT_EQ(d.rank_tokens, p.rank_tokens);
    EXPECT_EQ(d.rank_micro_batches, p.rank_micro_batches);
    ASSERT_EQ(d.micro.size(), p.micro.size());
    for (size_t m = 0; m < d.micro.size(); ++m) {
      EXPECT_EQ(values(d.micro[m].inputs), values(p.micro[m].inputs));
      EXPECT_EQ(values(d.micro[m].doc_start), values(p.micro[m].doc_start));
      EXPECT_EQ(d.weight(m), static_cast<double>(p.micro[m].loss_tokens) /
                                 static_cast<double>(std::max<int64_t>(p.global_loss_tokens, 1)));
    }
    EXPECT_EQ(source.state(), reference.state());
  }
  EXPECT_EQ(source.fingerprint(), reference.fingerprint());
  // The cut's line (Note [Loss tokens and the cut]), worded as the trainer logs it.
  const PackedDataStats& st = reference.stats();
  ASSERT_GT(st.cut_documents, 0);
  const std::string line = source.summary();
  EXPECT_EQ(line.rfind("data.train: " + std::to_string(st.documents) + " documents, ", 0), 0u)
      << line;
  EXPECT_NE(line.find(" longer than data.seq_len 6 are cut, losing "), std::string::npos) << line;
  EXPECT_NE(line.find(" documents keep no loss token"), std::string::npos) << line;
}

TEST(StepSource, NeedsALoaderAndMicroBatches) {
  EXPECT_THROW(WindowSource(nullptr, 1), Error);
  EXPECT_THROW(PackedSource(nullptr), Error);
}

}  // namespace
}  // namespace loom
