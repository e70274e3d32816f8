// tests/parallel/train_test_util.h — what the trainer tests under mpirun share: a learnable token
// stream written once by rank 0 into a directory every rank sees, and the TrainerOptions of a
// quiet run. Tests only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "data/shard.h"
#include "parallel/parallel_context.h"
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
      for (int32_t k = 0; k < 6; ++k) tokens.push_back(static_cast<int32_t>((x >> 16) % 4) * 10 + k);
    }
    write_shard(dir + "/data/train_000000.bin", std::span<const int32_t>(tokens));
  }
  ctx.world().barrier();
  return dir;
}

inline TrainerOptions trainer_options(std::ostream& log, ParallelContext* ctx, const std::string& resume = "",
                                      int64_t stop_at = 0) {
  TrainerOptions o;
  o.log = &log;
  o.print_config = false;
  o.parallel = ctx;
  o.resume = resume;
  o.stop_at_step = stop_at;
  return o;
}

}  // namespace loom::parallel::testing
