// tools/bench/cpu_isa.h — records, in a benchmark's context header, which ISA the program was
// compiled for (LOOM_ARCH, read from the compiler's predefined macros), which the CPU it runs
// on offers (/proc/cpuinfo) and which OpenBLAS kernels its GEMMs use, so every CPU figure says
// where it was measured (docs/performance.md). Reporting only: nothing here changes what a
// benchmark runs.
#pragma once

#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>

#include "kernels/matmul.h"

namespace loom::bench {

// The vector extensions this translation unit was compiled for, widest last.
inline std::string compiled_isa() {
  std::string isa = "x86-64";
#ifdef __AVX2__
  isa += " avx2";
#endif
#ifdef __FMA__
  isa += " fma";
#endif
#ifdef __AVX512F__
  isa += " avx512f";
#endif
#ifdef __AVX512BW__
  isa += " avx512bw";
#endif
#ifdef __AVX512VL__
  isa += " avx512vl";
#endif
#ifdef __AVX512BF16__
  isa += " avx512bf16";
#endif
#ifdef __AVX512FP16__
  isa += " avx512fp16";
#endif
#ifdef __AMX_TILE__
  isa += " amx";
#endif
  return isa;
}

// "model name" and the vector flags (avx*, amx*, fma) of the first CPU in /proc/cpuinfo.
inline std::string cpu_isa() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && model == "unknown CPU") model = value;
    if (key == "flags" && flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) {
        if (w.rfind("avx", 0) == 0 || w.rfind("amx", 0) == 0 || w == "fma") flags += " " + w;
      }
    }
  }
  return model + ":" + (flags.empty() ? " (no AVX)" : flags);
}

// Adds the three to the context Google Benchmark prints before its table (and to JSON output).
inline void add_isa_context() {
  benchmark::AddCustomContext("compiled_for", compiled_isa());
  benchmark::AddCustomContext("cpu", cpu_isa());
  benchmark::AddCustomContext("openblas_core", loom::kernels::cpu_blas_core());
}

// main() of a benchmark with no setup of its own: Google Benchmark's, with the ISA context.
inline int benchmark_main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  add_isa_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace loom::bench
