// tools/bench/tokenizer_bench.cpp — GPT-2 BPE encode throughput (bytes/s) on English text (the
// reference passages of tests/data/testdata), with a warm word cache, with the cache cleared
// before every pass, and fully cold (distinct text only), plus the pre-tokenizer alone. A
// measurement, never a test.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer.h"
#include "tools/bench/cpu_isa.h"

namespace {

const std::filesystem::path kRoot =
    std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();

std::string english_corpus(size_t min_bytes) {
  std::ifstream in(kRoot / "tests/data/testdata/gpt2_tokenizer_cases.jsonl");
  std::string line, text;
  while (std::getline(in, line)) {
    if (!line.empty()) text += nlohmann::json::parse(line).at("text").get<std::string>() + "\n";
  }
  if (text.empty()) return text;
  std::string out = text;
  while (out.size() < min_bytes) out += text;
  return out;
}

// range(0): clear the word cache before each pass; range(1): corpus bytes (the ~85 kB of
// distinct passages repeated up to that size; at 0 they appear once, so a cleared cache is cold).
void BM_Encode(benchmark::State& state) {
  const bool clear_cache = state.range(0) != 0;
  loom::Tokenizer tok((kRoot / "data/gpt2-bpe").string());
  const std::string text = english_corpus(static_cast<size_t>(state.range(1)));
  if (text.empty()) {
    state.SkipWithError("test corpus not found");
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    if (clear_cache) tok.clear_cache();
    const auto ids = tok.encode(text);
    tokens += ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Encode)
    ->Args({0, 4 << 20})
    ->Args({1, 4 << 20})
    ->Args({1, 0})
    ->ArgNames({"clear_cache", "bytes"})
    ->Unit(benchmark::kMillisecond);

void BM_Pretokenize(benchmark::State& state) {
  const std::string text = english_corpus(size_t{4} << 20);
  for (auto _ : state) benchmark::DoNotOptimize(loom::gpt2_pretokenize(text).size());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_Pretokenize)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return loom::bench::benchmark_main(argc, argv); }
