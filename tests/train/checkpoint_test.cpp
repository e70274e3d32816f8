// tests/train/checkpoint_test.cpp — safetensors round trip and validation, native checkpoint
// save/load, pruning, detection of truncated and corrupt files, and a failed save leaving the
// last good checkpoint intact.
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/crc32c.h"
#include "core/ops/view.h"
#include "core/rng.h"
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
  c.tensors = {
      whole_tensor("model.w", randn({3, 17}, gen)),
      whole_tensor("model.ids", Tensor::from_vector(std::vector<int32_t>{5, -1, 50256}, {3})),
      whole_tensor("optim.m", randn({65}, gen, DType::kF64))};
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
  for (const CheckpointTensor& t : c.tensors) {  // back in name order
    auto it = std::find_if(back.tensors.begin(), back.tensors.end(),
                           [&](const CheckpointTensor& b) { return b.name == t.name; });
    ASSERT_NE(it, back.tensors.end()) << t.name;
    EXPECT_EQ(it->values.dtype(), t.values.dtype()) << t.name;
    EXPECT_EQ(it->values.shape(), t.values.shape()) << t.name;
    EXPECT_EQ(it->values.to_vector(), t.values.to_vector()) << t.name;
  }
}

// Each stored tensor is a piece of its global tensor (core/tensor_piece.h): its metadata says which
// (a split as runs, a ZeRO range as a flat range) and holds its block checksums; a reader fills
// any other piece from the stored ones, and names what it cannot fill. (Pieces spread over
// several files: the trainer's cross-layout tests, tests/train/train_reshard_mpi_test.cpp.)
TEST(Checkpoint, StoresPiecesAndReadsAnyOtherPiece) {
  const std::string root = fresh_dir("placed");
  Generator gen(9);
  const std::vector<double> global = randn({9, 4}, gen).to_vector();
  auto rows = [&](const std::vector<int64_t>& r, DType dtype) {
    std::vector<double> v;
    for (int64_t i : r) v.insert(v.end(), global.begin() + i * 4, global.begin() + i * 4 + 4);
    return ops::to_dtype(Tensor::from_vector(v, {static_cast<int64_t>(r.size()), 4}), dtype);
  };
  // A fused-qkv-like part: rows 0, 3 and 6 of (9, 4); and the last 5 elements of rows 1, 4, 7.
  auto part = [](std::vector<PlacementRun> runs) {
    Placement p;
    p.global_shape = {9, 4};
    p.splits.push_back({0, "tp", std::move(runs)});
    return p;
  };
  const Placement a = part({{0, 0, 1}, {1, 3, 1}, {2, 6, 1}});
  const Placement b = part({{0, 1, 1}, {1, 4, 1}, {2, 7, 1}});
  CheckpointContents c;
  c.step = 3;
  c.tensors = {{"w", rows({0, 3, 6}, DType::kF32), piece_of(a, {3, 4})},
               {"v", rows({1, 4, 7}, DType::kF32).reshape({12}).narrow(0, 7, 5),
                piece_of(b, {3, 4}, 7, 12)}};
  const std::string dir = save_checkpoint(root, c, 0);
  const SafetensorsFile f =
      read_safetensors((fs::path(dir) / "tensors_00000.safetensors").string());
  EXPECT_EQ(f.metadata.at("w.piece"), "shape=9,4;d0=0@0+1,1@3+1,2@6+1;flat=0-12");
  EXPECT_EQ(f.metadata.at("v.piece"), "shape=9,4;d0=0@1+1,1@4+1,2@7+1;flat=7-12");
  EXPECT_EQ(f.metadata.at("w.crc32c").size(), 8u);  // one block

  const CheckpointReader r(dir);
  EXPECT_EQ(r.step(), 3);
  EXPECT_EQ(r.tensors().at("w"), (Shape{9, 4}));
  Tensor row3 = Tensor::empty({1, 4});  // row 3 alone
  r.read("w", piece_of(part({{0, 3, 1}}), {1, 4}), row3);
  EXPECT_EQ(row3.to_vector(), rows({3}, DType::kF32).to_vector());
  Tensor tail = Tensor::empty({2});  // elements 5-6 of rows (4, 7) in row-major order: row 7's 1-2
  r.read("v", piece_of(part({{0, 4, 1}, {1, 7, 1}}), {2, 4}, 5, 7), tail);
  EXPECT_EQ(tail.to_vector(), rows({7}, DType::kF32).reshape({4}).narrow(0, 1, 2).to_vector());
  // Row 1's first three elements were stored by nobody; a dtype the run holds differently.
  Tensor row1 = Tensor::empty({1, 4});
  EXPECT_NE(message_of([&] {
              r.read("v", piece_of(part({{0, 1, 1}}), {1, 4}), row1);
            }).find("stored nowhere"),
            std::string::npos);
  Tensor f64 = Tensor::empty({1, 4}, DType::kF64);
  EXPECT_NE(message_of([&] {
              r.read("w", piece_of(part({{0, 3, 1}}), {1, 4}), f64);
            }).find("stored as f32"),
            std::string::npos);
  EXPECT_NE(message_of([&] { r.read_whole("nope"); }).find("no tensor 'nope'"), std::string::npos);
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
  EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << "a damaged file is the user's, not the code's";
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
  bad.tensors.push_back({"model.bad", Tensor(), whole_piece({1})});
  EXPECT_ANY_THROW(save_checkpoint(root, bad, 1));
  EXPECT_EQ(latest_checkpoint(root), good);
  EXPECT_FALSE(fs::exists(root + "/step_00000006"));
  EXPECT_EQ(load_checkpoint(good).step, 5);
}

}  // namespace
}  // namespace loom
