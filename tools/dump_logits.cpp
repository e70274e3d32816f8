// tools/dump_logits.cpp — one forward pass of a freshly initialised model, written with its
// weights to one safetensors file so another framework can check Loom's numbers on the same
// weights (tools/compare_logits_torch.py does it with PyTorch + transformers).
//
//   dump_logits --config FILE [--set section.key=value]... [--device cpu|cuda] [--batch B]
//               [--seq T] [--seed S] --out FILE
//
// With model.init_from the weights are read from there (a checkpoint, a Hugging Face directory
// or an llm.c file) after the draw, which still decides the ids.
// The file holds every parameter under its Loom name (f32, CPU layout), "input_ids" (B, T) i64
// (uniform over the real vocabulary) and "logits" (B, T, Vp) f32, plus the model's shape in the
// metadata. The weights are drawn on the CPU (init_weights) and copied to the device, so a CPU
// and a CUDA dump with the same seed hold the same weights. Thin: no logic beyond the forward.
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "train/config.h"
#include "train/convert.h"
#include "train/safetensors.h"

namespace {

std::string exact(double v) {
  std::ostringstream s;
  s << std::setprecision(17) << v;
  return s.str();
}

int usage() {
  std::cerr << "usage: dump_logits --config FILE [--set section.key=value]... [--device cpu|cuda]"
               " [--batch B] [--seq T] [--seed S] --out FILE\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, out_path, device_name = "cpu";
  std::vector<std::string> overrides;
  int64_t batch = 1, seq = 0;
  uint64_t seed = 1234;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--config")
      config_path = v;
    else if (a == "--set")
      overrides.push_back(v);
    else if (a == "--device")
      device_name = v;
    else if (a == "--batch")
      batch = std::stoll(v);
    else if (a == "--seq")
      seq = std::stoll(v);
    else if (a == "--seed")
      seed = std::stoull(v);
    else if (a == "--out")
      out_path = v;
    else
      return usage();
  }
  if (config_path.empty() || out_path.empty() || (device_name != "cpu" && device_name != "cuda")) {
    return usage();
  }
  try {
    const loom::Config config = loom::load_config(config_path, overrides);
    const loom::ModelConfig& mc = config.model;
    if (seq <= 0) seq = mc.max_seq_len;
    const loom::Device device = device_name == "cuda" ? loom::Device::cuda(0) : loom::Device::cpu();

    loom::autograd::NoGradGuard no_grad;
    loom::Transformer host_model(mc);
    loom::Generator gen(seed);
    host_model.init_weights(gen);
    // model.init_from: a checkpoint, a Hugging Face directory or an llm.c file's weights.
    if (!config.train.init_from.empty())
      loom::load_model_weights(host_model, config.train.init_from, std::cerr);
    loom::Transformer model(mc, loom::DType::kF32, device);
    const auto src = host_model.named_parameters();
    auto dst = model.named_parameters();
    for (size_t i = 0; i < dst.size(); ++i)
      loom::ops::copy_(dst[i].second, src[i].second.to(device));

    const loom::Tensor ids = loom::randint({batch, seq}, 0, mc.vocab_size, gen, loom::DType::kI64);
    const loom::Tensor logits = model.forward(ids.to(device)).to(loom::Device::cpu());

    std::vector<std::pair<std::string, loom::Tensor>> tensors = src;
    tensors.emplace_back("input_ids", ids);
    tensors.emplace_back("logits", logits);
    const std::map<std::string, std::string> meta = {
        {"arch", mc.arch},
        {"n_layer", std::to_string(mc.n_layer)},
        {"n_head", std::to_string(mc.n_head)},
        {"n_kv_head", std::to_string(mc.kv_heads())},
        {"n_embd", std::to_string(mc.n_embd)},
        {"vocab_size", std::to_string(mc.vocab_size)},
        {"max_seq_len", std::to_string(mc.max_seq_len)},
        {"norm_eps", exact(mc.norm_eps)},
        {"rope_theta", exact(mc.rope_theta)},
        {"ffn_hidden", std::to_string(mc.ffn_hidden_size())},
        {"tie_embeddings", mc.tie_embeddings ? "true" : "false"},
        {"device", device.str()}};
    loom::write_safetensors(out_path, tensors, meta);
    std::cout << "dump_logits: " << out_path << ": " << src.size() << " parameters, logits "
              << loom::shape_str(logits.shape()) << " on " << device.str() << "\n";
    return 0;
  } catch (const loom::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dump_logits: " << e.what() << "\n";
    return 1;
  }
}
