// tests/train/train_test_util.h — what the trainer tests under mpirun share: a learnable token
// stream and learnable SFT documents written once by rank 0 into a directory every rank sees,
// the TrainerOptions of a quiet run, and the comparison of two checkpoints. Tests only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "data/documents.h"
#include "data/shard.h"
#include "parallel/parallel_context.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace loom::parallel::testing {

// Shards of a learnable stream (6-token runs starting at one of 4 values) under
// TempDir()/<name>/data, written by world rank 0; returns TempDir()/<name>. Collective.
inline std::string shared_train_data(ParallelContext& ctx, const std::string& name) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/" + name;
  if (ctx.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir + "/data");
    std::vector<int32_t> tokens;
    uint32_t x = 7;
    for (int i = 0; i < 8000; ++i) {
      x = x * 1103515245u + 12345u;
      for (int32_t k = 0; k < 6; ++k)
        tokens.push_back(static_cast<int32_t>((x >> 16) % 4) * 10 + k);
    }
    write_shard(dir + "/data/train_000000.bin", std::span<const int32_t>(tokens));
  }
  ctx.world().barrier();
  return dir;
}

// Document shards (data/documents.h) of a learnable "SFT" task with long-tailed lengths, under
// TempDir()/<name>/sft (TempDir()/<name> emptied first), written by world rank 0; returns that
// directory. Each document: a
// separator 62, a prompt of 1-40 tokens in [1, 30) (most short: length 1 + ⌊4 / u⌋ for u uniform,
// capped), a separator 60, then the response — the prompt reversed, shifted by 30 — and an end
// token 61; the loss mask covers the response and the end token. Collective.
inline std::string shared_sft_data(ParallelContext* ctx, const std::string& name,
                                   int64_t documents = 400) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/" + name + "/sft";
  if (!ctx || ctx->rank() == 0) {
    fs::remove_all(::testing::TempDir() + "/" + name);  // and the runs of an earlier test
    fs::create_directories(dir);
    for (int split = 0; split < 2; ++split) {
      std::vector<int32_t> tokens;
      std::vector<uint8_t> mask;
      std::vector<int64_t> offsets = {0};
      uint32_t x = split == 0 ? 11u : 12345u;
      auto draw = [&x] {
        x = x * 1103515245u + 12345u;
        return x >> 8;
      };
      const int64_t count = split == 0 ? documents : documents / 4;
      for (int64_t d = 0; d < count; ++d) {
        const double u = (static_cast<double>(draw() % 1000) + 1.0) / 1000.0;
        const int64_t len = std::min<int64_t>(40, 1 + static_cast<int64_t>(4.0 / u));
        std::vector<int32_t> prompt;
        for (int64_t i = 0; i < len; ++i) prompt.push_back(1 + static_cast<int32_t>(draw() % 29));
        tokens.push_back(62);
        mask.push_back(0);
        for (int32_t t : prompt) {
          tokens.push_back(t);
          mask.push_back(0);
        }
        tokens.push_back(60);
        mask.push_back(0);
        for (auto it = prompt.rbegin(); it != prompt.rend(); ++it) {
          tokens.push_back(*it + 30);
          mask.push_back(1);
        }
        tokens.push_back(61);
        mask.push_back(1);
        offsets.push_back(static_cast<int64_t>(tokens.size()));
      }
      write_document_shard(dir + (split == 0 ? "/train_000000.bin" : "/val_000000.bin"), tokens,
                           mask, offsets);
    }
  }
  if (ctx) ctx->world().barrier();
  return dir;
}

// Every tensor of checkpoint got_dir (parameters and optimizer state, layout-free) within
// abs_tol of checkpoint want_dir's; the two hold the same names. Rank 0 calls it.
inline void expect_close_checkpoints(const std::string& got_dir, const std::string& want_dir,
                                     double abs_tol) {
  const CheckpointContents got = load_checkpoint(got_dir), want = load_checkpoint(want_dir);
  std::map<std::string, Tensor> ref;
  for (const CheckpointTensor& t : want.tensors) ref.emplace(t.name, t.values);
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << got_dir;
  for (const CheckpointTensor& t : got.tensors) {
    ASSERT_TRUE(ref.count(t.name)) << t.name;
    const std::vector<double> x = t.values.to_vector(), y = ref.at(t.name).to_vector();
    ASSERT_EQ(x.size(), y.size()) << t.name;
    double worst = 0;
    for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
    // Optimizer moments are as close as the parameters; the second moments are O(g²) smaller.
    EXPECT_LE(worst, abs_tol) << t.name;
  }
}

inline TrainerOptions trainer_options(std::ostream& log, ParallelContext* ctx,
                                      const std::string& resume = "", int64_t stop_at = 0) {
  TrainerOptions o;
  o.log = &log;
  o.parallel = ctx;
  o.resume = resume;
  o.stop_at_step = stop_at;
  return o;
}

// Note [Sampling across ranks] (train/sampling.cpp): the next-token logits of a context whose
// length is no multiple of the layout's (so it is padded) match the single-process run's, on
// every rank, and so does a short sample (the same text). `parallel` is collective. The
// tolerance covers the trained parameters' f32 differences (≤ 2e-5 absolute).
inline void expect_same_sampling(Trainer& parallel, Trainer& single) {
  const std::vector<int32_t> context = {50256 % 61, 3, 14, 27, 5, 40, 41, 12, 9, 30, 1};
  const std::vector<double> a = parallel.next_token_logits(context),
                            b = single.next_token_logits(context);
  ASSERT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
  EXPECT_EQ(parallel.sample(6), single.sample(6));
}

}  // namespace loom::parallel::testing
