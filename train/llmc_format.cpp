// train/llmc_format.cpp — llm.c model files (Note [llm.c model file] in train/llmc_format.h).
#include "train/llmc_format.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/autograd.h"
#include "core/ops/view.h"

namespace loom {

namespace {

constexpr int kHeaderInts = 256;

struct LlmcHeader {
  int version = 0;
  int64_t max_t = 0, vocab = 0, layers = 0, heads = 0, embd = 0, padded_vocab = 0;
};

// One llm.c tensor: a Loom name, per layer ("blocks.{l}.<name>") or global.
struct LlmcTensor {
  const char* name;
  bool per_layer;
};

constexpr std::array<LlmcTensor, 16> kLlmcOrder = {{
    {"wte.weight", false},
    {"wpe.weight", false},
    {"ln_1.weight", true},
    {"ln_1.bias", true},
    {"attn.qkv.weight", true},
    {"attn.qkv.bias", true},
    {"attn.proj.weight", true},
    {"attn.proj.bias", true},
    {"ln_2.weight", true},
    {"ln_2.bias", true},
    {"mlp.fc.weight", true},
    {"mlp.fc.bias", true},
    {"mlp.proj.weight", true},
    {"mlp.proj.bias", true},
    {"ln_f.weight", false},
    {"ln_f.bias", false},
}};

// The model's parameters in file order.
std::vector<Tensor> file_order(const Transformer& model) {
  std::vector<Tensor> out;
  for (const LlmcTensor& t : kLlmcOrder) {
    if (!t.per_layer) {
      out.push_back(model.parameter(t.name));
      continue;
    }
    for (int64_t l = 0; l < model.config().n_layer; ++l) {
      out.push_back(model.parameter("blocks." + std::to_string(l) + "." + t.name));
    }
  }
  return out;
}

int64_t header_param_count(const LlmcHeader& h) {
  const int64_t C = h.embd;
  return h.padded_vocab * C + h.max_t * C + h.layers * (12 * C * C + 13 * C) + 2 * C;
}

LlmcHeader parse_header(const std::string& path, const std::array<int32_t, kHeaderInts>& raw) {
  LOOM_INPUT_CHECK(raw[0] == kLlmcMagic, path, ": not an llm.c model file (magic ", raw[0],
                   ", expected ", kLlmcMagic, ")");
  LOOM_INPUT_CHECK(raw[1] == kLlmcVersionF32 || raw[1] == kLlmcVersionBF16, path,
                   ": unsupported llm.c model version ", raw[1], " (supported: 3 = f32, 5 = bf16)");
  LlmcHeader h{raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7]};
  LOOM_INPUT_CHECK(h.max_t > 0 && h.vocab > 0 && h.layers > 0 && h.heads > 0 && h.embd > 0 &&
                       h.padded_vocab >= h.vocab && h.embd % h.heads == 0,
                   path, ": bad llm.c header (maxT ", h.max_t, ", V ", h.vocab, ", L ", h.layers,
                   ", NH ", h.heads, ", C ", h.embd, ", Vp ", h.padded_vocab, ")");
  return h;
}

// Opens the file, parses and checks its header, and checks its size against the header.
LlmcHeader open_checked(const std::string& path, std::ifstream& in) {
  in.open(path, std::ios::binary);
  LOOM_INPUT_CHECK(in.good(), path, ": cannot open llm.c model file");
  std::array<int32_t, kHeaderInts> raw{};
  in.read(reinterpret_cast<char*>(raw.data()), sizeof(raw));
  LOOM_INPUT_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof(raw)), path,
                   ": truncated llm.c header (", in.gcount(), " of ", sizeof(raw), " bytes)");
  const LlmcHeader h = parse_header(path, raw);
  const int64_t count = header_param_count(h);
  const int64_t elem = h.version == kLlmcVersionF32 ? 4 : 2;
  const int64_t expected = static_cast<int64_t>(sizeof(raw)) + count * elem;
  const int64_t actual = static_cast<int64_t>(std::filesystem::file_size(path));
  LOOM_INPUT_CHECK(actual == expected, path, ": file is ", actual,
                   " bytes but its header (version ", h.version, ", ", count,
                   " parameters) implies ", expected);
  return h;
}

ModelConfig config_of(const LlmcHeader& h) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = h.vocab;
  c.vocab_multiple = (h.vocab + 127) / 128 * 128 == h.padded_vocab ? 128 : h.padded_vocab;
  c.n_layer = h.layers;
  c.n_head = h.heads;
  c.n_kv_head = 0;
  c.n_embd = h.embd;
  c.max_seq_len = h.max_t;
  c.ffn_hidden = 0;
  c.tie_embeddings = true;
  return c;
}

// Names the first structural difference between the model and an llm.c GPT-2, or "".
std::string llmc_mismatch(const ModelConfig& m, const ModelConfig& f) {
  auto diff = [](const char* key, int64_t file, int64_t model) {
    return detail::str("model.", key, ": file has ", file, ", model has ", model);
  };
  if (m.arch != "gpt2") return "model.arch: file has gpt2, model has " + m.arch;
  if (!m.tie_embeddings) return "model.tie_embeddings: file has true, model has false";
  if (m.vocab_size != f.vocab_size) return diff("vocab_size", f.vocab_size, m.vocab_size);
  if (m.padded_vocab() != f.padded_vocab())
    return diff("padded vocab", f.padded_vocab(), m.padded_vocab());
  if (m.n_layer != f.n_layer) return diff("n_layer", f.n_layer, m.n_layer);
  if (m.n_head != f.n_head) return diff("n_head", f.n_head, m.n_head);
  if (m.kv_heads() != f.n_head) return diff("n_kv_head", f.n_head, m.kv_heads());
  if (m.n_embd != f.n_embd) return diff("n_embd", f.n_embd, m.n_embd);
  if (m.max_seq_len != f.max_seq_len) return diff("max_seq_len", f.max_seq_len, m.max_seq_len);
  if (m.ffn_hidden_size() != 4 * f.n_embd)
    return diff("ffn_hidden", 4 * f.n_embd, m.ffn_hidden_size());
  return "";
}

// The header of an llm.c file of version `version` holding a model of config c; an InputError
// naming `path` when llm.c cannot hold it (not a tied-head GPT-2, or sizes beyond int32).
std::array<int32_t, kHeaderInts> header_for(const ModelConfig& c, int version,
                                            const std::string& path) {
  std::array<int32_t, kHeaderInts> raw{};
  const std::array<int64_t, 8> fields = {kLlmcMagic, version,  c.max_seq_len, c.vocab_size,
                                         c.n_layer,  c.n_head, c.n_embd,      c.padded_vocab()};
  for (size_t i = 0; i < fields.size(); ++i) {
    LOOM_INPUT_CHECK(fields[i] <= INT32_MAX, path, ": llm.c header field ", i, " = ", fields[i],
                     " exceeds int32 (the model is too large for an llm.c file)");
    raw[i] = static_cast<int32_t>(fields[i]);
  }
  const std::string mismatch = llmc_mismatch(c, config_of(parse_header(path, raw)));
  LOOM_INPUT_CHECK(mismatch.empty(), path, ": llm.c files hold tied-head GPT-2 models only (",
                   mismatch, ")");
  return raw;
}

}  // namespace

ModelConfig read_llmc_config(const std::string& path) {
  std::ifstream in;
  return config_of(open_checked(path, in));
}

void load_llmc_model(const std::string& path, Transformer& model) {
  std::ifstream in;
  const LlmcHeader h = open_checked(path, in);
  const std::string mismatch = llmc_mismatch(model.config(), config_of(h));
  LOOM_INPUT_CHECK(mismatch.empty(), path, ": model does not match the file: ", mismatch);
  const DType file_dtype = h.version == kLlmcVersionF32 ? DType::kF32 : DType::kBF16;
  autograd::NoGradGuard no_grad;
  for (Tensor param : file_order(model)) {
    Tensor buf = Tensor::empty(param.shape(), file_dtype);
    in.read(static_cast<char*>(buf.raw_data()), static_cast<std::streamsize>(buf.nbytes()));
    LOOM_INPUT_CHECK(in.gcount() == static_cast<std::streamsize>(buf.nbytes()), path,
                     ": read failed (file truncated while loading?)");
    ops::copy_(param, buf.to(param.device()));
  }
}

void check_llmc_writable(const ModelConfig& c, const std::string& path) {
  header_for(c, kLlmcVersionF32, path);
}

void save_llmc_model(const std::string& path, const Transformer& model, int version) {
  LOOM_CHECK(version == kLlmcVersionF32 || version == kLlmcVersionBF16, path,
             ": unsupported llm.c model version ", version, " (supported: 3 = f32, 5 = bf16)");
  const std::array<int32_t, kHeaderInts> raw = header_for(model.config(), version, path);
  const DType file_dtype = version == kLlmcVersionF32 ? DType::kF32 : DType::kBF16;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(out.good(), tmp, ": cannot open for writing");
    out.write(reinterpret_cast<const char*>(raw.data()), sizeof(raw));
    autograd::NoGradGuard no_grad;
    for (const Tensor& param : file_order(model)) {
      const Tensor host = param.detach().to(Device{}).to(file_dtype).contiguous();
      out.write(static_cast<const char*>(host.raw_data()),
                static_cast<std::streamsize>(host.nbytes()));
    }
    out.flush();
    LOOM_CHECK(out.good(), tmp, ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  LOOM_CHECK(!ec, path, ": cannot rename ", tmp, " into place: ", ec.message());
}

}  // namespace loom
