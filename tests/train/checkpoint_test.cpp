// tests/train/checkpoint_test.cpp — safetensors round trip and validation, native checkpoint
// save/load, pruning, detection of truncated and corrupt files, and a failed save leaving the
// last good checkpoint intact.
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "train/crc32c.h"
#include "train/safetensors.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/loom_ckpt_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

CheckpointContents sample(int64_t step, Generator& gen) {
  CheckpointContents c;
  c.step = step;
  c.state = {{"loader.position", "17"}, {"rng.offset", "99"}};
  c.config_yaml = "train:\n  steps: 5\n";
  c.tensors = {{"model.w", randn({3, 17}, gen)},
               {"model.ids", Tensor::from_vector(std::vector<int32_t>{5, -1, 50256}, {3})},
               {"optim.m", randn({65}, gen, DType::kF64)}};
  return c;
}

TEST(Crc32c, KnownValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

TEST(Safetensors, RoundTripKeepsDTypesShapesAndBits) {
  Generator gen(1);
  const std::string path = fresh_dir("st") + "/a.safetensors";
  Tensor a = randn({2, 3, 5}, gen), b = randn({7}, gen, DType::kBF16);
  write_safetensors(path, {{"a", a.transpose(0, 2)}, {"b", b}}, {{"k", "v"}});
  SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[0].second.shape(), (Shape{5, 3, 2}));
  EXPECT_EQ(f.tensors[0].second.to_vector(), a.transpose(0, 2).to_vector());
  EXPECT_EQ(f.tensors[1].second.dtype(), DType::kBF16);
  EXPECT_EQ(f.tensors[1].second.to_vector(), b.to_vector());
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Safetensors, TruncatedFileIsNamed) {
  Generator gen(2);
  const std::string path = fresh_dir("st_trunc") + "/t.safetensors";
  write_safetensors(path, {{"w", randn({100}, gen)}});
  fs::resize_file(path, fs::file_size(path) - 10);
  const std::string msg = message_of([&] { read_safetensors(path); });
  EXPECT_NE(msg.find(path + ": truncated: tensor 'w'"), std::string::npos) << msg;
  fs::resize_file(path, 5);
  EXPECT_NE(message_of([&] { read_safetensors(path); }).find("truncated"), std::string::npos);
}

TEST(Checkpoint, SaveLoadRoundTrip) {
  Generator gen(3);
  const std::string root = fresh_dir("rt");
  CheckpointContents c = sample(12, gen);
  const std::string dir = save_checkpoint(root, c, 0);
  EXPECT_EQ(fs::path(dir).filename(), "step_00000012");
  CheckpointContents back = load_checkpoint(dir);
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.state, c.state);
  EXPECT_NE(back.config_yaml.find("steps: 5"), std::string::npos);
  ASSERT_EQ(back.tensors.size(), c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, c.tensors[i].first);
    EXPECT_EQ(back.tensors[i].second.dtype(), c.tensors[i].second.dtype());
    EXPECT_EQ(back.tensors[i].second.to_vector(), c.tensors[i].second.to_vector());
  }
}

// Each tensor's file metadata records where it sits in the global tensor, from its placement
// (core/placement.h): a one-run split by its offset, a part in several runs (a fused qkv's
// rows) run by run; a tensor without a placement is whole.
TEST(Checkpoint, RecordsGlobalShapesAndOffsetsFromPlacements) {
  const std::string root = fresh_dir("placed");
  Tensor row_part = Tensor::zeros({4, 3});  // columns [3, 6) of (4, 9), split over tp
  Placement row;
  row.global_shape = {4, 9};
  row.splits.push_back({1, "tp", {{0, 3, 3}}});
  row_part.set_placement(row);
  Tensor qkv_part = Tensor::zeros({3, 2});  // one row of each of q, k, v: (9, 2) over 3 ranks
  Placement qkv;
  qkv.global_shape = {9, 2};
  qkv.splits.push_back({0, "tp", {{0, 1, 1}, {1, 4, 1}, {2, 7, 1}}});
  qkv_part.set_placement(qkv);
  CheckpointContents c;
  c.step = 1;
  c.tensors = {{"row", row_part}, {"qkv", qkv_part}, {"whole", Tensor::zeros({2})}};
  const std::string dir = save_checkpoint(root, c, 0);
  const SafetensorsFile f =
      read_safetensors((fs::path(dir) / "tensors_00000.safetensors").string());
  EXPECT_EQ(f.metadata.at("row.global_shape"), "4,9");
  EXPECT_EQ(f.metadata.at("row.offsets"), "0,3");
  EXPECT_EQ(f.metadata.at("qkv.global_shape"), "9,2");
  EXPECT_EQ(f.metadata.at("qkv.offsets"), "runs");
  EXPECT_EQ(f.metadata.at("qkv.placement"),
            "global (9, 2); dim 0 over tp: 0→1 (1), 1→4 (1), 2→7 (1)");
  EXPECT_EQ(f.metadata.at("whole.global_shape"), "2");
  EXPECT_EQ(f.metadata.at("whole.offsets"), "0");
  EXPECT_EQ(f.metadata.count("whole.placement"), 0u);
}

TEST(Checkpoint, KeepsTheNewestAndFindsLatest) {
  Generator gen(4);
  const std::string root = fresh_dir("keep");
  EXPECT_EQ(latest_checkpoint(root), "");
  for (int64_t s : {10, 20, 30, 40}) save_checkpoint(root, sample(s, gen), 2);
  EXPECT_FALSE(fs::exists(root + "/step_00000010"));
  EXPECT_FALSE(fs::exists(root + "/step_00000020"));
  EXPECT_TRUE(fs::exists(root + "/step_00000030"));
  EXPECT_EQ(fs::path(latest_checkpoint(root)).filename(), "step_00000040");
}

TEST(Checkpoint, CorruptTensorIsDetected) {
  Generator gen(5);
  const std::string root = fresh_dir("corrupt");
  const std::string dir = save_checkpoint(root, sample(1, gen), 0);
  const std::string file = dir + "/tensors_00000.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 4));
    f.write("\x13\x37\x13\x37", 4);
  }
  const std::string msg = message_of([&] { load_checkpoint(dir); });
  EXPECT_NE(msg.find(file + ": tensor 'optim.m' is corrupt"), std::string::npos) << msg;
  fs::resize_file(file, fs::file_size(file) / 2);
  EXPECT_NE(message_of([&] { load_checkpoint(dir); }).find("truncated"), std::string::npos);
  EXPECT_NE(message_of([&] { load_checkpoint(root + "/nope"); }).find("not a checkpoint"),
            std::string::npos);
}

TEST(Checkpoint, FailedSaveLeavesTheLastGoodCheckpoint) {
  Generator gen(6);
  const std::string root = fresh_dir("fail");
  const std::string good = save_checkpoint(root, sample(5, gen), 1);
  CheckpointContents bad = sample(6, gen);
  // A tensor that cannot be written: on a device this build cannot read back.
  bad.tensors.push_back({"model.bad", Tensor()});
  EXPECT_ANY_THROW(save_checkpoint(root, bad, 1));
  EXPECT_EQ(latest_checkpoint(root), good);
  EXPECT_FALSE(fs::exists(root + "/step_00000006"));
  EXPECT_EQ(load_checkpoint(good).step, 5);
}

}  // namespace
}  // namespace loom
