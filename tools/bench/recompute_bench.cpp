// tools/bench/recompute_bench.cpp — activation memory and step time of each model.recompute
// mode (none, full, selective with each list: Note [Selective recompute] in core/checkpoint.h)
// on a model whose activations dominate (a long sequence), against the formulas. A
// measurement, never a test:
//   build/bin/recompute_bench [--arch gpt2|llama] [--layers 4] [--embd 128] [--seq 2048]
//                             [--steps 3]
// Per mode it runs one warm-up and `steps` timed steps (forward, backward; no optimizer) and
// reports: held, the CPU allocator's bytes alive at the end of the forward above those before
// it (what the blocks keep for backward, plus the head's); peak, the allocator's peak during the
// step above the bytes before it; the step time (median) and its ratio to none's. Predicted:
// for none and full the memory planner's "activations (end of forward)" (train/planner/
// memory.h, which replays the step's allocations); for selective, full's prediction plus
// layers × the kept results of one block (Note [Selective recompute]; per token, matmul: GPT-2
// qkv 3C, proj C, the fused MLP's pre-activation F and output C, Llama qkv q + 2kv, proj C,
// gate F, up F, down C; attention: its output q and one lse per head).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "tools/bench/cpu_isa.h"
#include "train/config.h"
#include "train/planner/memory.h"

namespace {

using namespace loom;

struct Args {
  std::string arch = "gpt2";
  int64_t layers = 4, embd = 128, seq = 2048;
  int steps = 3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--arch") {
      a.arch = v;
    } else if (k == "--layers") {
      a.layers = std::atol(v.c_str());
    } else if (k == "--embd") {
      a.embd = std::atol(v.c_str());
    } else if (k == "--seq") {
      a.seq = std::atol(v.c_str());
    } else if (k == "--steps") {
      a.steps = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "recompute_bench: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// The train config of the measured model (B 1, f32, a 512-token vocabulary).
Config config_of(const Args& a, const std::string& recompute, const std::string& save) {
  const std::string yaml =
      "model: {arch: " + a.arch +
      ", vocab_size: 512, vocab_multiple: 64, n_layer: " + std::to_string(a.layers) +
      ", n_head: 4" + (a.arch == "llama" ? ", n_kv_head: 2" : "") +
      ", n_embd: " + std::to_string(a.embd) + ", max_seq_len: " + std::to_string(a.seq) +
      ", recompute: " + recompute + (save.empty() ? "" : ", recompute_save: \"" + save + "\"") +
      "}\ndata: {train: x.bin, batch_size: 1, seq_len: " + std::to_string(a.seq) + "}\n";
  return parse_config_text(yaml);
}

int64_t planned_activations(const Config& c) {
  for (const planner::MemoryLine& l : planner::plan_memory(c, {}).lines) {
    if (l.what == "activations (end of forward)") return l.bytes;
  }
  return -1;
}

// Bytes one block keeps beyond full recompute (f32).
int64_t kept_per_block(const ModelConfig& m, const std::string& save, int64_t n) {
  const int64_t C = m.n_embd, F = m.ffn_hidden_size(), q = m.n_head * m.head_dim(),
                kv = m.kv_heads() * m.head_dim();
  const int64_t matmul = m.is_llama() ? n * (q + 2 * kv + C + 2 * F + C) : n * (3 * C + C + F + C);
  const int64_t attention = n * q + n * m.n_head;
  return 4 * ((save.find("matmul") != std::string::npos ? matmul : 0) +
              (save.find("attention") != std::string::npos ? attention : 0));
}

struct Mode {
  std::string recompute, save;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const std::vector<Mode> modes = {{"none", ""},
                                   {"full", ""},
                                   {"selective", "matmul,attention"},
                                   {"selective", "matmul"},
                                   {"selective", "attention"}};
  std::printf("recompute_bench: %s, %lld layers, C %lld, T %lld, B 1, f32 — %s (compiled for %s)\n",
              a.arch.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.embd),
              static_cast<long long>(a.seq), bench::cpu_isa().c_str(),
              bench::compiled_isa().c_str());
  std::printf("%-28s %12s %12s %12s %10s %8s\n", "model.recompute", "held MiB", "predicted",
              "peak MiB", "step ms", "vs none");
  Allocator& alloc = allocator_for(DeviceType::kCpu);
  const int64_t full_predicted = planned_activations(config_of(a, "full", ""));
  double none_ms = 0;
  for (const Mode& mode : modes) {
    const Config cfg = config_of(a, mode.recompute, mode.save);
    Generator gen(1);
    Transformer model(cfg.model);
    model.init_weights(gen);
    const Tensor ids = randint({1, a.seq}, 0, cfg.model.vocab_size, gen, DType::kI32);
    const Tensor targets = randint({1, a.seq}, 0, cfg.model.vocab_size, gen, DType::kI32);
    int64_t held = 0, peak = 0;
    std::vector<double> ms;
    for (int step = 0; step <= a.steps; ++step) {
      for (Tensor p : model.parameters()) p.zero_grad();
      const int64_t before = alloc.stats().current_bytes;
      alloc.reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      Tensor loss = model.loss(ids, targets);
      held = alloc.stats().current_bytes - before;
      autograd::backward(loss);
      const auto t1 = std::chrono::steady_clock::now();
      peak = alloc.stats().peak_bytes - before;
      if (step > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    if (mode.recompute == "none") none_ms = median;
    const int64_t predicted =
        mode.recompute == "selective"
            ? full_predicted + a.layers * kept_per_block(cfg.model, mode.save, a.seq)
            : planned_activations(cfg);
    const std::string name = mode.recompute + (mode.save.empty() ? "" : " [" + mode.save + "]");
    auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    std::printf("%-28s %12.2f %12.2f %12.2f %10.1f %8.2f\n", name.c_str(), mib(held),
                mib(predicted), mib(peak), median, median / none_ms);
  }
  return 0;
}
