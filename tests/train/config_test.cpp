// tests/train/config_test.cpp — YAML parsing, overrides, and one test per kind of config error:
// each must be a one-line ConfigError naming the key.
#include "train/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "kernels/attention.h"
#include "layers/transformer.h"

namespace loom {
namespace {

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config_text(yaml, overrides);
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
    return msg;
  }
  return "";
}

TEST(Config, ParsesSectionsAndKeepsDefaults) {
  const Config c = parse_config_text(
      "model:\n  n_layer: 3\n  n_embd: 48\n  n_head: 4\n"
      "optim:\n  lr: 1.0e-3\n  schedule: wsd\n"
      "train:\n  steps: 7\n");
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_embd, 48);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.schedule, "wsd");
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_DOUBLE_EQ(c.optim.beta2, OptimConfig{}.beta2);  // untouched default
}

TEST(Config, OverridesApplyAfterTheFile) {
  const Config c = parse_config_text(
      "train:\n  steps: 7\n",
      {"train.steps=9", "model.arch=llama", "optim.lr=0.5", "model.init_from=gpt2.bin"});
  EXPECT_EQ(c.train.init_from, "gpt2.bin");
  EXPECT_EQ(c.train.steps, 9);
  EXPECT_EQ(c.model.arch, "llama");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
}

TEST(Config, EffectiveConfigRoundTrips) {
  Config c = parse_config_text("model:\n  n_layer: 5\n", {"data.batch_size=3"});
  const Config back = parse_config_text(config_to_yaml(c));
  EXPECT_EQ(config_to_yaml(back), config_to_yaml(c));
  EXPECT_EQ(back.model.n_layer, 5);
  EXPECT_EQ(back.data.batch_size, 3);
}

TEST(Config, UnknownKeysAndSectionsAreErrors) {
  EXPECT_EQ(error_of("optim:\n  lrr: 1\n"), "optim.lrr: unknown key");
  EXPECT_EQ(error_of("optimizer:\n  lr: 1\n"), "optimizer: unknown section");
  EXPECT_EQ(error_of("", {"train.stepz=3"}), "train.stepz: unknown key");
  EXPECT_EQ(error_of("", {"nodot=3"}), "--set nodot=3: expected section.key=value");
}

TEST(Config, WrongTypesNameTheKey) {
  EXPECT_EQ(error_of("optim:\n  lr: fast\n"), "optim.lr: expected a number, got 'fast'");
  EXPECT_EQ(error_of("model:\n  n_layer: 2.5\n"), "model.n_layer: expected an integer, got '2.5'");
  EXPECT_EQ(error_of("logging:\n  jsonl: maybe\n"),
            "logging.jsonl: expected true or false, got 'maybe'");
  EXPECT_EQ(error_of("model:\n  n_layer: [1, 2]\n"),
            "model.n_layer: expected an integer, got a list");
  EXPECT_EQ(error_of("data:\n  seed: -1\n"),
            "data.seed: expected a non-negative integer, got '-1'");
}

TEST(Config, ImpossibleValuesNameTheKeys) {
  EXPECT_EQ(error_of("model:\n  n_embd: 100\n  n_head: 3\n"),
            "model.n_embd: 100 is not divisible by model.n_head 3");
  EXPECT_EQ(error_of("model:\n  n_head: 8\n  n_kv_head: 3\n  n_embd: 64\n"),
            "model.n_kv_head: 3 does not divide model.n_head 8");
  EXPECT_EQ(error_of("model:\n  arch: gpt3\n"),
            "model.arch: unknown architecture 'gpt3' (expected gpt2 or llama)");
  EXPECT_EQ(error_of("data:\n  seq_len: 2048\n"),
            "data.seq_len: 2048 exceeds model.max_seq_len 1024");
  EXPECT_EQ(error_of("optim:\n  schedule: cosin\n"),
            "optim.schedule: unknown schedule 'cosin' (cosine, linear, constant, wsd)");
  EXPECT_EQ(error_of("optim:\n  grad_accum: 0\n"), "optim.grad_accum: must be positive, got 0");
  EXPECT_EQ(error_of("optim:\n  lr: 0.001\n  min_lr: 0.01\n"),
            "optim.min_lr: must be in [0, optim.lr], got 0.01");
  EXPECT_EQ(error_of("model:\n  dropout: 1.5\n"), "model.dropout: must be in [0, 1), got 1.5");
  EXPECT_EQ(error_of("train:\n  steps: 0\n"), "train.steps: must be positive, got 0");
  EXPECT_EQ(error_of("train:\n  steps: 10\noptim:\n  warmup_steps: 20\n"),
            "optim.warmup_steps: 20 exceeds train.steps 10");
  EXPECT_EQ(
      error_of("train:\n  steps: 10\noptim:\n  schedule: wsd\n  warmup_steps: 5\n  decay_fraction: "
               "0.8\n"),
      "optim.decay_fraction: the wsd decay (8 of train.steps 10) overlaps optim.warmup_steps 5");
  EXPECT_EQ(error_of("model:\n  arch: llama\n  n_embd: 30\n  n_head: 10\n"),
            "model.n_embd: head dim n_embd/n_head = 3 must be even for RoPE (llama)");
}

TEST(Config, PipelineKeysNameTheKeys) {
  auto err = [](const std::string& parallel, int64_t accum, const std::string& model = "") {
    return error_of("model:\n  n_layer: 12\n" + model +
                    "optim:\n  grad_accum: " + std::to_string(accum) + "\nparallel:\n" + parallel);
  };
  EXPECT_EQ(
      err("  pp: 5\n", 5),
      "parallel.pp: pp·vpp = 5 does not divide model.n_layer 12 (or give parallel.pp_layout)");
  EXPECT_EQ(err("  pp: 2\n  schedule: interleaved\n", 3),
            "parallel.microbatches: 3 is not a multiple of parallel.pp 2 (the interleaved schedule "
            "needs m % pp == 0)");
  EXPECT_NE(err("  pp: 2\n  vpp: 2\n", 2)
                .find("parallel.vpp: 2 virtual stages need parallel.schedule: interleaved"),
            std::string::npos);
  EXPECT_EQ(err("  pp: 2\n  pp_layout: \"6,5\"\n", 2),
            "parallel.pp_layout: the entries sum to 11, expected model.n_layer 12");
  EXPECT_EQ(err("  pp: 2\n  pp_layout: \"4,4,4\"\n", 2),
            "parallel.pp_layout: 3 entries, expected pp·vpp = 2");
  EXPECT_NE(err("  pp: 4\n", 2).find("parallel.microbatches: 2 micro-batches"), std::string::npos);
  EXPECT_EQ(err("  pp: 2\n  dp: 2\n  zero_stage: 3\n", 2),
            "");  // any ZeRO stage with pp (Note [Sharded stages])
  EXPECT_NE(err("  pp: 2\n  microbatches: 3\n", 2)
                .find("parallel.microbatches: 3 conflicts with optim.grad_accum 2"),
            std::string::npos);
  EXPECT_EQ(err("  schedule: zb\n", 1),
            "parallel.schedule: unknown schedule 'zb' (expected gpipe, 1f1b, interleaved, zb-h1 "
            "or zb-v)");
  // zb-h1, also with recomputed blocks (Note [Split backward] in core/autograd.h).
  EXPECT_EQ(err("  pp: 2\n  schedule: zb-h1\n", 2), "");
  EXPECT_EQ(err("  pp: 2\n  schedule: zb-h1\n", 2, "  recompute: full\n"), "");
  EXPECT_EQ(err("  vpp: 2\n  schedule: interleaved\n", 1),
            "parallel.vpp: virtual stages need parallel.pp > 1");
  // Valid: 4 stages of 3 blocks as 2 ranks × 2 chunks, 4 micro-batches from grad_accum.
  EXPECT_EQ(err("  pp: 2\n  vpp: 2\n  schedule: interleaved\n", 4), "");
  EXPECT_EQ(err("  pp: 2\n  pp_layout: \"5,7\"\n", 2), "");
  Config c = parse_config_text("optim:\n  grad_accum: 6\nparallel:\n  pp: 2\n");
  EXPECT_EQ(pipeline_microbatches(c), 6);
  c.parallel.microbatches = 6;
  EXPECT_EQ(pipeline_microbatches(c), 6);
}

// ZeRO stages 0-3 are accepted, alone and with MiCS; anything else names the key.
TEST(Config, ZeroStagesAndMics) {
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string z = "parallel.zero_stage=" + std::to_string(stage);
    EXPECT_EQ(error_of("", {"parallel.dp=4", z}), "") << z;
    EXPECT_EQ(error_of("", {"parallel.dp=4", z, "parallel.mics_partition_size=2"}),
              stage >= 1 ? ""
                         : "parallel.mics_partition_size: MiCS shards optimizer state; set "
                           "parallel.zero_stage to 1, 2 or 3")
        << z;
  }
  EXPECT_EQ(parse_config_text("parallel:\n  dp: 4\n  zero_stage: 3\n").parallel.zero_stage, 3);
  EXPECT_EQ(error_of("", {"parallel.dp=4", "parallel.zero_stage=4"}),
            "parallel.zero_stage: 4 is not supported (0, 1, 2 or 3)");
  EXPECT_EQ(error_of("", {"parallel.dp=4", "parallel.zero_stage=-1"}),
            "parallel.zero_stage: -1 is not supported (0, 1, 2 or 3)");
  EXPECT_EQ(
      error_of("", {"parallel.dp=4", "parallel.zero_stage=3", "parallel.mics_partition_size=3"}),
      "parallel.mics_partition_size: 3 does not divide parallel.dp 4");
}

// MiCS partitions the dp·cp reduction group under context parallelism (Note [MiCS groups] in
// parallel/mesh.h): the partition size must divide dp·cp, and the error names both.
TEST(Config, MicsWithContextParallelism) {
  const std::vector<std::string> dp2cp2 = {"parallel.dp=2", "parallel.cp=2",
                                           "parallel.zero_stage=1"};
  for (const char* p : {"parallel.mics_partition_size=1", "parallel.mics_partition_size=2",
                        "parallel.mics_partition_size=4"}) {
    std::vector<std::string> o = dp2cp2;
    o.emplace_back(p);
    EXPECT_EQ(error_of("", o), "") << p;
  }
  // cp alone: dp 1 × cp 2 ranks still form a partition of 2.
  EXPECT_EQ(
      error_of("", {"parallel.cp=2", "parallel.zero_stage=1", "parallel.mics_partition_size=2"}),
      "");
  std::vector<std::string> o = dp2cp2;
  o.emplace_back("parallel.mics_partition_size=3");
  EXPECT_EQ(error_of("", o),
            "parallel.mics_partition_size: 3 does not divide parallel.dp 2 × parallel.cp 2 = 4");
  o.back() = "parallel.mics_partition_size=8";
  EXPECT_EQ(error_of("", o),
            "parallel.mics_partition_size: 8 does not divide parallel.dp 2 × parallel.cp 2 = 4");
}

// SGD runs only where the trainer owns the optimizer: the data-parallel engine (dp > 1, and cp > 1,
// whose gradients it reduces too) runs AdamW, so SGD there is refused by name instead of being
// replaced by AdamW silently.
// The sharded data-parallel optimizer wraps either optimizer, so every layout takes both
// (the MPI trainer tests run SGD under dp, cp and ZeRO against one process).
TEST(Config, SgdAndAdamWInEveryLayout) {
  for (const char* name : {"optim.name=sgd", "optim.name=adamw"}) {
    EXPECT_EQ(error_of("", {name}), "");
    EXPECT_EQ(error_of("", {name, "parallel.dp=2"}), "");
    EXPECT_EQ(error_of("", {name, "parallel.cp=2"}), "");
    EXPECT_EQ(error_of("", {name, "parallel.dp=2", "parallel.zero_stage=2"}), "");
  }
  EXPECT_EQ(error_of("", {"optim.name=lion"}), "optim.name: unknown optimizer 'lion' (adamw, sgd)");
}

// Dropout was refused with sequence or context parallelism until each rank could draw the masks
// of its own rows (the rows form of Note [Dropout mask]); now every layout accepts it.
TEST(Config, DropoutCombinesWithSequenceAndContextParallelism) {
  const std::string model =
      "model: {n_layer: 2, n_head: 4, n_embd: 32, dropout: 0.1}\ndata: {seq_len: 16}\n";
  EXPECT_EQ(error_of(model + "parallel: {tp: 2, sequence_parallel: true}\n"), "");
  EXPECT_EQ(error_of(model + "parallel: {cp: 2}\n"), "");
  EXPECT_EQ(error_of(model + "parallel: {cp: 2, tp: 2, sequence_parallel: true}\n"), "");
  EXPECT_DOUBLE_EQ(parse_config_text(model + "parallel: {cp: 2}\n").model.dropout, 0.1);
}

TEST(Config, PrecisionAndDeviceKeys) {
  const Config d = parse_config_text("");
  EXPECT_EQ(d.train.device, "cpu");
  EXPECT_EQ(d.train.precision, "f32");
  EXPECT_FALSE(d.train.allow_tf32);
  const Config c = parse_config_text("train: {device: cuda, precision: bf16, allow_tf32: true}\n");
  EXPECT_EQ(c.train.device, "cuda");  // availability is the trainer's check, not the parser's
  EXPECT_EQ(c.train.precision, "bf16");
  EXPECT_TRUE(c.train.allow_tf32);
  EXPECT_EQ(parse_config_text("", {"train.precision=f64"}).train.precision,
            "f64");  // f32 masters, f64 compute
  EXPECT_EQ(parse_config_text("", {"train.dtype=f64", "train.precision=f64"}).train.dtype, "f64");

  EXPECT_EQ(error_of("train: {precision: f8}\n"),
            "train.precision: unknown precision 'f8' (f32, bf16, f16; f64 for CPU checks)");
  EXPECT_EQ(error_of("train: {precision: bf16}\n"),
            "train.precision: bf16 needs train.device: cuda (the CPU kernels compute in f32 and "
            "f64 only)");
  EXPECT_EQ(error_of("train: {precision: f16}\n"),
            "train.precision: f16 needs train.device: cuda (the CPU kernels compute in f32 and f64 "
            "only)");
  EXPECT_EQ(error_of("train: {dtype: f64}\n"),
            "train.precision: f32 with train.dtype f64: mixed precision keeps f32 master weights "
            "(set train.dtype: f32, or train.precision: f64)");
  EXPECT_EQ(error_of("train: {dtype: bf16, device: cuda}\n"),
            "train.dtype: unsupported parameter dtype 'bf16' (f32, f64; for bf16/f16 compute set "
            "train.precision)");
  EXPECT_EQ(error_of("train: {allow_tf32: true}\n"),
            "train.allow_tf32: TF32 is a CUDA feature; set train.device: cuda");
  EXPECT_EQ(error_of("train: {device: tpu}\n"), "train.device: unknown device 'tpu' (cpu, cuda)");
  EXPECT_EQ(error_of("train: {device: cuda, precision: f16}\nparallel: {dp: 2}\n"),
            "");  // scaled across ranks
  EXPECT_EQ(error_of("train: {loss_scaling: dynamic, initial_loss_scale: 1024}\n"), "");
  EXPECT_EQ(error_of("train: {loss_scaling: sometimes}\n"),
            "train.loss_scaling: unknown value 'sometimes' (auto, dynamic, none)");
  EXPECT_EQ(error_of("train: {device: cuda, precision: f16, loss_scaling: none}\n"),
            "train.loss_scaling: none with train.precision f16 would lose small gradients (use "
            "auto or dynamic)");
  EXPECT_EQ(error_of("train: {initial_loss_scale: 0.5}\n"),
            "train.initial_loss_scale: must be finite and at least 1, got 0.5");
}

TEST(Config, AttentionKernel) {
  EXPECT_EQ(parse_config_text("").train.attention_kernel, "auto");
  EXPECT_EQ(error_of("train: {device: cuda, attention_kernel: flash}\n"),
            "train.attention_kernel: unknown value 'flash' (auto, loom, cudnn)");
  EXPECT_EQ(error_of("train: {attention_kernel: auto}\n"), "");  // Loom's kernels on the CPU
  EXPECT_EQ(error_of("train: {attention_kernel: cudnn}\n"),
            "train.attention_kernel: cudnn is a CUDA feature; set train.device: cuda");
  // Accepted on cuda exactly when this build has the cuDNN path.
  const std::string on_cuda =
      error_of("train: {device: cuda, precision: bf16, attention_kernel: cudnn}\n");
  if (kernels::cudnn_attention_built()) {
    EXPECT_EQ(on_cuda, "");
  } else {
    EXPECT_EQ(on_cuda,
              "train.attention_kernel: cudnn, but this build has no cuDNN attention (CMake did not "
              "find cuDNN's frontend headers; tools/install_deps.sh fetches them)");
  }
}

TEST(Config, CommunicatorBackend) {
  EXPECT_FALSE(uses_nccl(parse_config_text("")));
  EXPECT_FALSE(uses_nccl(parse_config_text("parallel: {backend: mpi}\n")));
  EXPECT_EQ(error_of("parallel: {backend: gloo}\n"),
            "parallel.backend: unknown backend 'gloo' (auto, nccl, mpi, mpi_nccl_rules)");
  EXPECT_EQ(error_of("parallel: {backend: nccl}\n"),
            "parallel.backend: nccl moves GPU tensors; set train.device: cuda (or "
            "parallel.backend: mpi)");
  // On cuda (validated without a GPU: the device is looked for when training starts).
  EXPECT_TRUE(uses_nccl(parse_config_text("train: {device: cuda}\n")));
  EXPECT_TRUE(uses_nccl(parse_config_text("train: {device: cuda}\nparallel: {backend: nccl}\n")));
  EXPECT_FALSE(uses_nccl(parse_config_text("train: {device: cuda}\nparallel: {backend: mpi}\n")));
  // The pipeline too (its transfers are issued in NCCL-safe groups: Note [Communication order]).
  const std::string pp2 =
      "model: {n_layer: 2}\noptim: {grad_accum: 2}\ntrain: {device: cuda}\nparallel: {pp: 2";
  EXPECT_TRUE(uses_nccl(parse_config_text(pp2 + "}\n")));
  EXPECT_EQ(error_of(pp2 + ", backend: nccl}\n"), "");
  // MPI following NCCL's rules, on CPUs.
  EXPECT_EQ(error_of("parallel: {backend: mpi_nccl_rules}\n"), "");
  EXPECT_FALSE(uses_nccl(parse_config_text("parallel: {backend: mpi_nccl_rules}\n")));
}

TEST(Config, MalformedYamlAndMissingFile) {
  EXPECT_NE(error_of("model: [unclosed\n").find("malformed YAML at line"), std::string::npos);
  try {
    load_config("/nonexistent/gpt.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "/nonexistent/gpt.yaml: cannot read the config file: No such file or directory");
  }
  const std::string path = ::testing::TempDir() + "/bad.yaml";
  std::ofstream(path) << "train:\n  steps: -4\n";
  try {
    load_config(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": train.steps: must be positive, got -4");
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Found by trying to break it (issue 28): YAML after a second "---" was silently ignored, by
// parse_config_text and by load_config; it is refused, naming the file and the line. An empty
// document after it (a trailing "---") drops nothing and is accepted.
TEST(Config, RefusesASecondYamlDocument) {
  EXPECT_EQ(error_of("train:\n  steps: 7\n---\ntrain:\n  steps: 9\n"),
            "config: a second YAML document starts at line 4 (after '---'): the file must hold one "
            "document, or the rest would be ignored");
  EXPECT_EQ(parse_config_text("---\ntrain:\n  steps: 7\n---\n").train.steps, 7);
  const std::string path = ::testing::TempDir() + "/two_docs.yaml";
  std::ofstream(path) << "train:\n  steps: 7\n---\noptim:\n  lr: 0.5\n";
  try {
    load_config(path);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": a second YAML document starts at line 4", 0),
              0u)
        << e.what();
  }
  try {
    load_config(::testing::TempDir());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), ::testing::TempDir() + ": is a directory, not a config file");
  }
}

// data.tokenizer: gpt2 (the default) or hf:PATH, anything else named.
TEST(Config, TokenizerKey) {
  EXPECT_EQ(parse_config_text("").data.tokenizer, "gpt2");
  EXPECT_EQ(parse_config_text("data:\n  tokenizer: hf:models/llama\n").data.tokenizer,
            "hf:models/llama");
  EXPECT_EQ(error_of("data:\n  tokenizer: llama3\n"),
            "data.tokenizer: 'llama3' is not gpt2 or hf:PATH (a tokenizer.json or a directory "
            "holding one)");
}

// Every shipped config validates, and the model sizes match the published parameter counts.
TEST(Config, PackingKeys) {
  const Config c = parse_config_text(
      "data:\n  packing: true\n  balance: flops\n  max_tokens_per_microbatch: 512\n");
  EXPECT_TRUE(c.data.packing);
  EXPECT_EQ(c.data.balance, "flops");
  EXPECT_EQ(c.data.max_tokens_per_microbatch, 512);
  EXPECT_EQ(error_of("data:\n  packing: true\n  balance: lpt\n"),
            "data.balance: 'lpt' is not one of none, tokens, flops");
  EXPECT_EQ(error_of("data:\n  balance: flops\n"),
            "data.balance: flops needs data.packing true (fixed-length windows are equal work "
            "already)");
  EXPECT_EQ(error_of("data:\n  max_tokens_per_microbatch: 128\n"),
            "data.max_tokens_per_microbatch: needs data.packing true");
  EXPECT_EQ(error_of("data:\n  packing: true\n  max_tokens_per_microbatch: 32\n"),
            "data.max_tokens_per_microbatch: 32 is below data.seq_len 64 (the longest document "
            "must fit)");
  EXPECT_EQ(error_of("data:\n  packing: true\noptim:\n  grad_accum: 2\n"),
            "optim.grad_accum: must be 1 with data.packing (the token budget "
            "data.max_tokens_per_microbatch sets the micro-batches), got 2");
  const std::string refused =
      "data.packing: not supported with parallel.tp, pp, or cp > 1 with ring attention yet "
      "(data parallelism, ZeRO, MiCS, ODC and cp with parallel.cp_attention: ulysses are)";
  EXPECT_EQ(error_of("data:\n  packing: true\nparallel:\n  tp: 2\n"), refused);
  EXPECT_EQ(error_of("data:\n  packing: true\nparallel:\n  cp: 2\n"), refused);
  EXPECT_EQ(error_of("data:\n  packing: true\nparallel:\n  cp: 2\n  cp_attention: ulysses\n"), "");
}

TEST(Config, ShippedConfigsValidateWithPublishedSizes) {
  struct Case {
    const char* file;
    int64_t params;  // without vocab padding
  };
  for (Case c :
       {Case{"gpt2-124m", 124439808}, Case{"gpt2-350m", 354823168}, Case{"gpt2-774m", 774030080},
        Case{"gpt2-1.5b", 1557611200}, Case{"llama-1b", 1235814400}, Case{"llama3-8b", 8030261248},
        Case{"gpt2-tiny", 0}, Case{"llama-tiny", 0}, Case{"sft-tiny", 0}}) {
    const Config cfg = load_config(std::string(LOOM_SOURCE_DIR) + "/configs/" + c.file + ".yaml");
    if (c.params > 0) {
      EXPECT_EQ(count_parameters(cfg.model, true), c.params) << c.file;
    }
  }
}

// Found by trying to break the parser: a duplicated key or section (yaml-cpp would keep the
// first value without a word), a key that is not a plain word, sizes whose products overflow or
// could never be allocated (each named, instead of heap corruption later), a negative
// sample_tokens.
TEST(Config, RefusesDuplicatesOddKeysAndImpossibleSizes) {
  EXPECT_EQ(error_of("optim:\n  lr: 1.0e-3\n  lr: 5.0e-1\n"),
            "config: optim.lr: the key appears twice (lines 2 and 3; the first value would win)");
  EXPECT_EQ(error_of("optim:\n  lr: 1.0e-3\noptim:\n  eps: 1.0e-8\n"),
            "config: optim: the key appears twice (lines 1 and 3; the first value would win)");
  EXPECT_EQ(error_of("parallel:\n  sdp: {mode: forward, mode: backward}\n"),
            "config: parallel.sdp.mode: the key appears twice (lines 2 and 2; the first value "
            "would win)");
  EXPECT_EQ(error_of("optim:\n  [a, b]: 1\n"), "optim: a key must be a plain word, got a list");
  EXPECT_EQ(error_of("? [x]\n: 1\n"), "config: a section name must be a plain word, got a list");
  for (const char* huge :
       {"model.max_seq_len=9223372036854775807", "model.vocab_size=144115188075855872",
        "model.n_embd=3458764513820540928", "model.ffn_hidden=144115188075855872"}) {
    const std::string msg = error_of("", {huge});
    const std::string key = std::string(huge).substr(0, std::string(huge).find('='));
    EXPECT_EQ(msg.rfind(key + ": ", 0), 0u) << huge << " → " << msg;
    EXPECT_NE(msg.find("exceeds the largest size"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of("", {"model.n_embd=1048576", "model.n_head=1"}).find("2^40 elements"),
            std::string::npos);
  EXPECT_EQ(error_of("", {"train.sample_tokens=-1"}),
            "train.sample_tokens: must be in [0, 2^20], got -1");
}

// parallel.sdp (a mapping under parallel): defaults, the nested key in the file, in an override
// and in the effective config; every refusal names its key.
TEST(Config, SdpKeysNameTheKeys) {
  const Config d = parse_config_text("");
  EXPECT_EQ(d.parallel.sdp.mode, "none");
  EXPECT_EQ(d.parallel.sdp.level, "neuron");
  EXPECT_EQ(d.parallel.sdp.coverage, 1.0);
  EXPECT_EQ(d.parallel.sdp.seed, 0);
  const std::vector<std::string> ok = {"parallel.dp=4", "checkpoint.at_end=false"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = ok;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  const Config c = parse_config_text(
      "parallel:\n  dp: 4\n  sdp:\n    mode: forward\n    coverage: 0.5\n    seed: 7\n"
      "checkpoint:\n  at_end: false\n");
  EXPECT_EQ(c.parallel.sdp.mode, "forward");
  EXPECT_EQ(c.parallel.sdp.coverage, 0.5);
  EXPECT_EQ(c.parallel.sdp.seed, 7);
  const Config o =
      parse_config_text("", with({"parallel.sdp.mode=forward", "parallel.sdp.coverage=0.75"}));
  EXPECT_EQ(o.parallel.sdp.mode, "forward");
  EXPECT_EQ(o.parallel.sdp.coverage, 0.75);
  const Config back = parse_config_text(config_to_yaml(c));  // the nested mapping round-trips
  EXPECT_EQ(back.parallel.sdp.mode, "forward");
  EXPECT_EQ(back.parallel.sdp.coverage, 0.5);
  EXPECT_EQ(back.parallel.sdp.seed, 7);
  EXPECT_EQ(back.parallel.dp, 4);
  EXPECT_EQ(error_of("parallel:\n  sdp:\n    colour: red\n"), "parallel.sdp.colour: unknown key");
  EXPECT_EQ(error_of("parallel:\n  sdp: 3\n"), "parallel.sdp: expected a mapping of keys");
  EXPECT_EQ(error_of("parallel.sdp:\n  mode: forward\n"), "parallel.sdp: unknown section");
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=sideways"})),
            "parallel.sdp.mode: unknown mode 'sideways' (none, forward, backward)");
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.level=layer"})),
            "parallel.sdp.level: unknown level 'layer' (neuron, block)");
  EXPECT_EQ(error_of("", with({"parallel.sdp.coverage=0"})),
            "parallel.sdp.coverage: must be in (0, 1], got 0");
  EXPECT_EQ(error_of("", with({"parallel.sdp.seed=-1"})),
            "parallel.sdp.seed: must be non-negative, got -1");
  EXPECT_EQ(error_of("", with({"parallel.sdp.workers=-2"})),
            "parallel.sdp.workers: must be >= 0 (0: parallel.dp), got -2");
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=forward", "parallel.dp=1"})),
            "parallel.sdp.mode: SDP needs at least 2 workers (parallel.sdp.workers, or "
            "parallel.dp when it is 0), got 1");
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.workers=3"})),
            "parallel.sdp.workers: 3 does not divide parallel.dp 4 (the dp group holds "
            "parallel.dp / workers copies)");
  EXPECT_NE(error_of("", with({"parallel.sdp.mode=forward", "parallel.tp=2"}))
                .find("parallel.sdp.mode: SDP runs over parallel.dp alone; set parallel.tp"),
            std::string::npos);
  EXPECT_NE(error_of("", with({"parallel.sdp.mode=forward", "parallel.zero_stage=1"}))
                .find("set parallel.zero_stage to 0 (got 1)"),
            std::string::npos);
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=backward", "model.init_from=/x"})),
            "parallel.sdp.mode: model.init_from is not supported with backward masking yet (the "
            "frozen copies are not loaded from it; forward masking supports it)");
  // Both regimes at both levels load, with checkpoints on (the defaults) and data-parallel
  // copies; the block level needs C·n_layer whole (the default n_layer is 12).
  for (const char* mode : {"forward", "backward"}) {
    for (const char* level : {"neuron", "block"}) {
      EXPECT_EQ(error_of("", {"parallel.dp=8", std::string("parallel.sdp.mode=") + mode,
                              std::string("parallel.sdp.level=") + level,
                              "parallel.sdp.coverage=0.5", "parallel.sdp.workers=4"}),
                "")
          << mode << " " << level;
    }
  }
  // parallel.sdp.heads: the neuron level only (either regime); the KV groups' cover checked.
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=backward", "parallel.sdp.heads=true",
                               "parallel.sdp.level=block"})),
            "parallel.sdp.heads: attention heads are covered at the neuron level only (a block "
            "holds all its heads; got level block)");
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=backward", "parallel.sdp.heads=true",
                               "parallel.sdp.coverage=0.5"})),
            "");
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.heads=true",
                               "parallel.sdp.coverage=0.5"})),
            "");  // the default 12 heads over 4 workers
  const std::string few =
      error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.heads=true",
                         "parallel.sdp.coverage=0.5", "model.n_head=2", "model.n_embd=64"}));
  EXPECT_NE(few.find("model.n_head: "), std::string::npos) << few;  // GPT-2 has no n_kv_head
  const std::string few_kv = error_of(
      "", with({"parallel.sdp.mode=forward", "parallel.sdp.heads=true", "parallel.sdp.coverage=0.5",
                "model.arch=llama", "model.n_head=4", "model.n_kv_head=2", "model.n_embd=64"}));
  EXPECT_NE(few_kv.find("model.n_kv_head: "), std::string::npos) << few_kv;
  // SDP keys while SDP is off would be ignored: refused, naming them; defaults pass.
  EXPECT_EQ(error_of("", with({"parallel.sdp.seed=7"})),
            "parallel.sdp.seed: set, but parallel.sdp.mode is none (SDP is off) and would ignore "
            "it; set parallel.sdp.mode (forward or backward) or remove it");
  EXPECT_EQ(error_of("", with({"parallel.sdp.coverage=0.5", "parallel.sdp.heads=true"})),
            "parallel.sdp.coverage, parallel.sdp.heads: set, but parallel.sdp.mode is none (SDP "
            "is off) and would ignore them; set parallel.sdp.mode (forward or backward) or remove "
            "them");
  EXPECT_EQ(error_of("", with({"parallel.sdp.seed=0", "parallel.sdp.mode=none"})), "");
  const std::string blocks =
      error_of("", {"parallel.dp=4", "parallel.sdp.mode=forward", "parallel.sdp.level=block",
                    "parallel.sdp.coverage=0.5", "model.n_layer=3"});
  EXPECT_NE(blocks.find("model.n_layer"), std::string::npos) << blocks;
  // The cover's own checks (parallel/sdp/assignment.h) at load time: C·N not whole, k = 1.
  const std::string frac =
      error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.coverage=0.3"}));
  EXPECT_EQ(frac.rfind("parallel.sdp.coverage: ", 0), 0u) << frac;
  const std::string one =
      error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.coverage=0.25"}));
  EXPECT_NE(one.find("parallel.sdp.coverage"), std::string::npos) << one;
  EXPECT_EQ(error_of("", with({"parallel.sdp.mode=forward", "parallel.sdp.coverage=0.5"})), "");
}

// The resume's key-by-key comparison: nested sections by their full key, one line each.
TEST(Config, FlattenedForComparisonOneLineAKey) {
  Config c = parse_config_text("parallel:\n  dp: 4\n  sdp:\n    mode: forward\n    seed: 7\n");
  const std::map<std::string, std::string> f = flatten_config(config_to_yaml(c));
  EXPECT_EQ(f.at("parallel.sdp.seed"), "7");
  EXPECT_EQ(f.at("parallel.sdp.mode"), "forward");
  EXPECT_EQ(f.at("parallel.dp"), "4");
  EXPECT_EQ(f.count("parallel.sdp"), 0u);
  for (const auto& [key, value] : f) EXPECT_EQ(value.find('\n'), std::string::npos) << key;
}

// data.seq_len need not be even without context parallelism (the 2·cp chunks are cp's).
// parallel.cp_attention (Note [Ulysses] in parallel/cp/ulysses.h): ring or ulysses; Ulysses
// needs a tp rank's heads to split over cp and its kv heads to split or divide it.
TEST(Config, UlyssesNamesTheHeadsItCannotSplit) {
  const std::string model = "model: {n_head: 4, n_kv_head: 2, n_embd: 64, arch: llama}\n";
  EXPECT_EQ(error_of(model + "parallel: {cp: 4, cp_attention: ulysses}\n"), "");
  EXPECT_EQ(error_of(model + "parallel: {cp: 2, tp: 2, cp_attention: ulysses}\n"), "");
  EXPECT_NE(error_of(model + "parallel: {cp: 8, cp_attention: ulysses}\ndata: {seq_len: 64}\n")
                .find("model.n_head: the 4 heads of a tensor-parallel rank do not split over "
                      "parallel.cp 8"),
            std::string::npos);
  EXPECT_NE(error_of("model: {n_head: 6, n_kv_head: 3, n_embd: 96, arch: llama}\n"
                     "parallel: {cp: 2, cp_attention: ulysses}\n")
                .find("model.n_kv_head: the 3 kv heads"),
            std::string::npos);
  EXPECT_NE(error_of("parallel: {cp: 2, cp_attention: star}\n")
                .find("parallel.cp_attention: unknown 'star' (ring, ulysses, hybrid)"),
            std::string::npos);
}

TEST(Config, OddSeqLenWithoutContextParallelism) {
  EXPECT_EQ(parse_config_text("data:\n  seq_len: 15\n").data.seq_len, 15);
}

// data.global_batch derives optim.grad_accum from batch_size and dp (Note [Global batch]).
TEST(Config, GlobalBatchDerivesGradAccum) {
  const Config c =
      parse_config_text("data: {batch_size: 4, global_batch: 32}\nparallel: {dp: 2}\n");
  EXPECT_EQ(c.optim.grad_accum, 4);
  EXPECT_EQ(global_batch_sequences(c), 32);
  EXPECT_EQ(parse_config_text("data: {batch_size: 4, global_batch: 32}\noptim: {grad_accum: 8}\n")
                .optim.grad_accum,
            8);
  EXPECT_EQ(error_of("data: {batch_size: 4, global_batch: 30}\nparallel: {dp: 2}\n"),
            "data.global_batch: 30 is not a multiple of data.batch_size 4 × parallel.dp 2 = 8");
  EXPECT_EQ(error_of("data: {batch_size: 4, global_batch: 32}\noptim: {grad_accum: 2}\n"),
            "optim.grad_accum: 2 conflicts with data.global_batch 32 (= data.batch_size 4 × "
            "parallel.dp 1 × 8); leave it to data.global_batch");
  EXPECT_NE(error_of("data: {global_batch: 16, packing: true}\n")
                .find("data.global_batch: not "
                      "supported with data.packing"),
            std::string::npos);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// parallel.diloco (a mapping under parallel): defaults, the file and overrides, the effective
// config; every refusal names its key.
TEST(Config, DilocoKeysNameTheKeys) {
  const Config d = parse_config_text("");
  EXPECT_FALSE(d.parallel.diloco.on());
  EXPECT_EQ(d.parallel.diloco.outer, "nesterov");
  EXPECT_EQ(d.parallel.diloco.outer_lr, 0.7);
  EXPECT_EQ(d.parallel.diloco.outer_momentum, 0.9);
  const std::vector<std::string> on = {"parallel.diloco.islands=3",
                                       "parallel.diloco.rendezvous=/shared/job"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = on;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  const Config c = parse_config_text(
      "parallel:\n  diloco:\n    islands: 4\n    island: 2\n    rendezvous: /r\n"
      "    inner_steps: 40\n    fragments: 4\n    overlap_steps: 2\n    quantize: int4\n");
  EXPECT_EQ(c.parallel.diloco.islands, 4);
  EXPECT_EQ(c.parallel.diloco.bits(), 4);
  const Config back = parse_config_text(config_to_yaml(c));
  EXPECT_EQ(back.parallel.diloco.overlap_steps, 2);
  EXPECT_EQ(back.parallel.diloco.rendezvous, "/r");
  EXPECT_EQ(error_of("", {"parallel.diloco.islands=2"}),
            "parallel.diloco.rendezvous: islands meet through a directory they all reach; set it "
            "(one per job)");
  EXPECT_EQ(error_of("", with({"parallel.diloco.island=3"})),
            "parallel.diloco.island: 3 is not an island of parallel.diloco.islands 3 (0..2)");
  EXPECT_EQ(error_of("", with({"parallel.diloco.outer=adam"})),
            "parallel.diloco.outer: 'adam' (nesterov, sgd or average)");
  EXPECT_EQ(error_of("", with({"parallel.diloco.fragments=3", "parallel.diloco.inner_steps=10"})),
            "parallel.diloco.fragments: 3 must divide parallel.diloco.inner_steps 10 (the "
            "fragments sync at offsets H/P apart)");
  EXPECT_NE(error_of("", with({"parallel.diloco.fragments=2", "parallel.diloco.inner_steps=10",
                               "parallel.diloco.overlap_steps=5"}))
                .find("parallel.diloco.overlap_steps: must be in 0..4"),
            std::string::npos);
  EXPECT_EQ(error_of("", with({"parallel.diloco.quantize=int2"})),
            "parallel.diloco.quantize: 'int2' (none, int8 or int4)");
  EXPECT_EQ(error_of("", with({"parallel.diloco.lanes=2"})),
            "parallel.diloco.lanes: must be in 0..1 (the island's ranks; got 2)");
  EXPECT_EQ(error_of("", {"parallel.diloco.inner_steps=5"}),
            "parallel.diloco.inner_steps: set, but parallel.diloco.islands is 0 (DiLoCo is off); "
            "set parallel.diloco.islands or remove the keys");
  EXPECT_NE(error_of("", with({"data.packing=true"}))
                .find("parallel.diloco: islands > 1 with "
                      "data.packing is not supported yet"),
            std::string::npos);
}

// parallel.cp_attention: hybrid with parallel.cp_ulysses u (Note [Hybrid context parallelism]
// in parallel/cp/hybrid.h): u divides cp, a tp rank's heads split over u (kv heads split or
// divide it), the key is refused without hybrid, and packed documents and a sliding window are
// refused as under ring attention.
TEST(Config, HybridContextParallelismNamesItsKeys) {
  const std::string model = "model: {n_head: 4, n_kv_head: 2, n_embd: 64, arch: llama}\n";
  const Config c = parse_config_text(model +
                                     "parallel: {cp: 4, cp_attention: hybrid, "
                                     "cp_ulysses: 2}\n");
  EXPECT_EQ(c.parallel.cp_ulysses, 2);
  EXPECT_EQ(error_of(model + "parallel: {cp: 8, cp_attention: hybrid, cp_ulysses: 4}\n"
                             "data: {seq_len: 64}\n"),
            "");  // 2 kv heads, each repeated over 2 of the 4 Ulysses ranks
  EXPECT_EQ(error_of(model + "parallel: {cp: 4, cp_attention: hybrid, cp_ulysses: 3}\n"),
            "parallel.cp_ulysses: 3 does not divide parallel.cp 4 (parallel.cp_attention: hybrid "
            "runs cp_ulysses Ulysses ranks × cp / cp_ulysses ring ranks)");
  EXPECT_EQ(error_of(model + "parallel: {cp: 4, cp_attention: hybrid}\n"),
            "parallel.cp_ulysses: parallel.cp_attention: hybrid needs its Ulysses ranks (>= 1, "
            "dividing parallel.cp 4), got 0");
  EXPECT_EQ(error_of(model + "parallel: {cp: 4, cp_ulysses: 2}\n"),
            "parallel.cp_ulysses: 2 Ulysses ranks need parallel.cp_attention: hybrid (got ring)");
  EXPECT_EQ(error_of(model + "parallel: {cp: 8, cp_attention: hybrid, cp_ulysses: 8}\n"
                             "data: {seq_len: 64}\n"),
            "model.n_head: the 4 heads of a tensor-parallel rank do not split over "
            "parallel.cp_ulysses 8 (parallel.cp_attention: hybrid splits heads)");
  EXPECT_EQ(error_of("model: {n_head: 6, n_kv_head: 3, n_embd: 96, arch: llama}\n"
                     "parallel: {cp: 4, cp_attention: hybrid, cp_ulysses: 2}\n"),
            "model.n_kv_head: the 3 kv heads of a tensor-parallel rank neither split over nor "
            "divide parallel.cp_ulysses 2 (parallel.cp_attention: hybrid)");
  EXPECT_EQ(error_of("data:\n  packing: true\nparallel:\n  cp: 2\n  cp_attention: hybrid\n"
                     "  cp_ulysses: 2\n"),
            "data.packing: not supported with parallel.tp, pp, or cp > 1 with ring attention yet "
            "(data parallelism, ZeRO, MiCS, ODC and cp with parallel.cp_attention: ulysses are)");
  EXPECT_NE(error_of("model: {n_head: 4, n_embd: 64, arch: llama, sliding_window: 8}\n"
                     "parallel: {cp: 2, cp_attention: hybrid, cp_ulysses: 2}\n")
                .find("with hybrid attention has no sliding window"),
            std::string::npos);
}

// zb-v (Note [ZB-V] in parallel/pp/schedule.h) runs 2 chunks per rank: parallel.vpp left at 1
// becomes 2 (so the layers split into 2·pp stages), 2 is accepted, anything else is named.
TEST(Config, ZeroBubbleVPlacesTwoChunksPerRank) {
  auto err = [](const std::string& parallel, int64_t accum, int64_t n_layer = 12) {
    return error_of("model:\n  n_layer: " + std::to_string(n_layer) + "\noptim:\n  grad_accum: " +
                    std::to_string(accum) + "\nparallel:\n" + parallel);
  };
  EXPECT_EQ(err("  pp: 2\n  schedule: zb-v\n", 4), "");
  EXPECT_EQ(err("  pp: 2\n  vpp: 2\n  schedule: zb-v\n", 4), "");
  EXPECT_EQ(err("  pp: 3\n  schedule: zb-v\n", 1), "");  // fewer micro-batches than stages
  EXPECT_EQ(err("  pp: 2\n  vpp: 3\n  schedule: zb-v\n", 4, 6)
                .rfind("parallel.vpp: zb-v runs 2 chunks per rank", 0),
            0U);
  EXPECT_EQ(err("  pp: 4\n  schedule: zb-v\n", 4),
            "parallel.pp: pp·vpp = 8 does not divide model.n_layer 12 (or give "
            "parallel.pp_layout)");
  const Config c = parse_config_text(
      "model:\n  n_layer: 8\noptim:\n  grad_accum: 4\nparallel:\n  pp: 2\n  "
      "schedule: zb-v\n");
  EXPECT_EQ(c.parallel.vpp, 2);
  const Config one = parse_config_text("parallel:\n  schedule: zb-v\n");  // no pipeline
  EXPECT_EQ(one.parallel.vpp, 1);
}

// model.recompute: none, full or selective with the ops it keeps (Note [Selective recompute]
// in core/checkpoint.h); what recompute keeps may change on resume, unlike the rest of model.*.
TEST(Config, RecomputeModesAndTheirList) {
  EXPECT_EQ(parse_config_text("").model.recompute, "none");
  const Config c = parse_config_text("model: {recompute: selective, recompute_save: attention}\n");
  EXPECT_EQ(c.model.recompute, "selective");
  EXPECT_EQ(c.model.recompute_save, "attention");
  EXPECT_EQ(parse_config_text("", {"model.recompute=full"}).model.recompute, "full");
  EXPECT_EQ(error_of("", {"model.recompute=some"}),
            "model.recompute: unknown 'some' (none, full, selective)");
  EXPECT_EQ(error_of("", {"model.recompute=selective", "model.recompute_save=matmul,softmax"}),
            "model.recompute_save: unknown op 'softmax' in 'matmul,softmax' (a comma-separated "
            "list of matmul, attention)");
  EXPECT_EQ(error_of("", {"model.recompute=full", "model.recompute_save=softmax"}), "")
      << "the list is read for selective recompute only";
  EXPECT_EQ(error_of("", {"model.activation_checkpointing=true"}),
            "model.activation_checkpointing: now model.recompute (full for true, none for "
            "false; or selective)");
}

// parallel.schedule_costs (Note [Schedule costs] in parallel/pp/schedule.h): unit by default,
// measured or "F,B,W" under zb-h1 and zb-v; a bad value or costs under another schedule name the
// key.
TEST(Config, ScheduleCostsKey) {
  const std::string zb = "optim:\n  grad_accum: 4\nparallel:\n  pp: 2\n  schedule: zb-v\n";
  EXPECT_EQ(parse_config_text(zb).parallel.schedule_costs, "unit");
  EXPECT_EQ(error_of(zb, {"parallel.schedule_costs=measured"}), "");
  EXPECT_EQ(error_of(zb, {"parallel.schedule_costs=1,3,1"}), "");
  EXPECT_EQ(error_of(zb + "  schedule_costs: \"2,3,1\"\n"), "");
  EXPECT_EQ(error_of(zb, {"parallel.schedule_costs=1,3"}),
            "parallel.schedule_costs: expected unit, measured or three positive ratios \"F,B,W\" "
            "(e.g. \"1,2,1\"), got '1,3'");
  EXPECT_EQ(error_of(zb, {"parallel.schedule_costs=fast"}).rfind("parallel.schedule_costs: ", 0),
            0U);
  EXPECT_EQ(error_of(zb, {"parallel.schedule_costs=0,1,1"}).rfind("parallel.schedule_costs: ", 0),
            0U);
  EXPECT_EQ(error_of("optim:\n  grad_accum: 4\nparallel:\n  pp: 2\n  schedule_costs: measured\n"),
            "parallel.schedule_costs: only zb-h1 and zb-v build their lists from op costs "
            "(parallel.schedule is 1f1b); leave it at unit");
}

}  // namespace
}  // namespace loom
