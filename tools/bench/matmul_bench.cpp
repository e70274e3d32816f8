// tools/bench/matmul_bench.cpp — CPU GEMM throughput for GPT-2's Linear shapes, forward and both
// backward forms, measured three ways in one run: Loom's ops::matmul, raw cblas_sgemm on the
// same buffers, and Eigen (row-major maps, .noalias() products). The table printed at the end
// (Loom/BLAS ratio) is what justifies OpenBLAS over Eigen in kernels/cpu/matmul.cpp; see
// docs/performance.md. A measurement, never a test: it asserts nothing about speed.
//
//   build-bench/bin/matmul_bench [--benchmark_filter=...]
//
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/matmul.h"
#include "core/rng.h"
#include "tools/bench/cpu_isa.h"
#include "tools/bench/eigen.h"

namespace loom {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One GPT-2 Linear: x (M, K) · wᵀ with w (N, K), as in Linear's forward.
struct LinearShape {
  int64_t m, k, n;
};

enum class Pass { kForward, kGradInput, kGradWeight };
enum class Impl { kLoom, kBlas, kEigen };

const char* pass_name(Pass p) {
  return p == Pass::kForward ? "fwd Y = X·Wᵀ" : p == Pass::kGradInput ? "dX = dY·W" : "dW = dYᵀ·X";
}
const char* impl_name(Impl i) {
  return i == Impl::kLoom ? "loom" : i == Impl::kBlas ? "blas" : "eigen";
}

// Preallocated random operands and outputs for one shape, shared by all three implementations.
struct Operands {
  Tensor x, w, dy;   // x (M,K)  w (N,K)  dy (M,N)
  Tensor y, dx, dw;  // outputs for BLAS/Eigen: y (M,N)  dx (M,K)  dw (N,K)
  Operands(const LinearShape& s, Generator& gen)
      : x(randn({s.m, s.k}, gen)),
        w(randn({s.n, s.k}, gen, DType::kF32, 0.0, 0.02)),
        dy(randn({s.m, s.n}, gen)),
        y(Tensor::empty({s.m, s.n})),
        dx(Tensor::empty({s.m, s.k})),
        dw(Tensor::empty({s.n, s.k})) {}
};

// The GEMM dims of a pass: rows and columns of its output, and the inner dim.
struct GemmDims {
  int64_t m, n, k;
};
GemmDims gemm_dims(const LinearShape& s, Pass p) {
  switch (p) {
    case Pass::kForward:
      return {s.m, s.n, s.k};
    case Pass::kGradInput:
      return {s.m, s.k, s.n};
    case Pass::kGradWeight:
      break;
  }
  return {s.n, s.k, s.m};
}

void run_loom(const Operands& o, Pass p) {
  autograd::NoGradGuard no_grad;
  Tensor out;
  if (p == Pass::kForward) out = ops::matmul(o.x, o.w, false, true);
  if (p == Pass::kGradInput) out = ops::matmul(o.dy, o.w, false, false);
  if (p == Pass::kGradWeight) out = ops::matmul(o.dy, o.x, true, false);
  benchmark::DoNotOptimize(out.raw_data());
}

void run_blas(const Operands& o, const LinearShape& s, Pass p) {
  const int M = static_cast<int>(s.m), K = static_cast<int>(s.k), N = static_cast<int>(s.n);
  const float *x = o.x.data<float>(), *w = o.w.data<float>(), *dy = o.dy.data<float>();
  if (p == Pass::kForward) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, x, K, w, K, 0.f,
                o.y.data<float>(), N);
  } else if (p == Pass::kGradInput) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.f, dy, N, w, K, 0.f,
                o.dx.data<float>(), K);
  } else {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.f, dy, N, x, K, 0.f,
                o.dw.data<float>(), K);
  }
}

void run_eigen(const Operands& o, const LinearShape& s, Pass p) {
  Eigen::Map<const RowMat> x(o.x.data<float>(), s.m, s.k), w(o.w.data<float>(), s.n, s.k);
  Eigen::Map<const RowMat> dy(o.dy.data<float>(), s.m, s.n);
  if (p == Pass::kForward) {
    Eigen::Map<RowMat>(o.y.data<float>(), s.m, s.n).noalias() = x * w.transpose();
  } else if (p == Pass::kGradInput) {
    Eigen::Map<RowMat>(o.dx.data<float>(), s.m, s.k).noalias() = dy * w;
  } else {
    Eigen::Map<RowMat>(o.dw.data<float>(), s.n, s.k).noalias() = dy.transpose() * x;
  }
}

// One row of the final table: a pass of a shape, GFLOP/s per implementation.
struct Row {
  std::string label;
  double flops[3] = {0, 0, 0};    // summed over every repetition
  double seconds[3] = {0, 0, 0};  // wall-clock, summed likewise
  double gflops(int impl) const {
    return seconds[impl] > 0 ? flops[impl] / seconds[impl] / 1e9 : 0;
  }
};

// Console output as usual, plus GFLOP/s per (row, implementation) from wall-clock time.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  TableReporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}
  // name → (row index, implementation); filled before the run.
  std::map<std::string, std::pair<size_t, Impl>> index;
  std::map<std::string, double> flops_per_iter;
  std::vector<Row> rows;

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string name = r.run_name.function_name;  // without the min_time/real_time suffixes
      auto it = index.find(name);
      if (it == index.end() || r.error_occurred || r.run_type == Run::RT_Aggregate) continue;
      Row& row = rows[it->second.first];
      const int impl = static_cast<int>(it->second.second);
      row.flops[impl] += flops_per_iter[name] * static_cast<double>(r.iterations);
      row.seconds[impl] += r.real_accumulated_time;
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void print_table() const {
    std::printf(
        "\n| Linear M×K×N | pass | GEMM m×n×k | Loom GFLOP/s | BLAS GFLOP/s | Eigen GFLOP/s | "
        "Loom/BLAS |\n");
    std::printf("|---|---|---|---:|---:|---:|---:|\n");
    for (const Row& row : rows) {
      if (row.gflops(0) == 0 && row.gflops(1) == 0 && row.gflops(2) == 0) continue;  // filtered out
      const double ratio = row.gflops(1) > 0 ? row.gflops(0) / row.gflops(1) : 0.0;
      std::printf("| %s | %.1f | %.1f | %.1f | %.2f |\n", row.label.c_str(), row.gflops(0),
                  row.gflops(1), row.gflops(2), ratio);
    }
  }
};

void register_all(const std::vector<LinearShape>& shapes,
                  std::vector<std::unique_ptr<Operands>>& ops, TableReporter& reporter) {
  for (size_t si = 0; si < shapes.size(); ++si) {
    const LinearShape s = shapes[si];
    const Operands* o = ops[si].get();
    for (Pass p : {Pass::kForward, Pass::kGradInput, Pass::kGradWeight}) {
      const auto [m, n, k] = gemm_dims(s, p);
      const double flops =
          2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
      const std::string dims =
          std::to_string(m) + "×" + std::to_string(n) + "×" + std::to_string(k);
      const std::string linear =
          std::to_string(s.m) + "×" + std::to_string(s.k) + "×" + std::to_string(s.n);
      reporter.rows.push_back({linear + " | " + pass_name(p) + " | " + dims});
      for (Impl impl : {Impl::kLoom, Impl::kBlas, Impl::kEigen}) {
        const std::string name = std::string(impl_name(impl)) + "/" + dims + "/" +
                                 (p == Pass::kForward     ? "fwd"
                                  : p == Pass::kGradInput ? "dX"
                                                          : "dW");
        reporter.index[name] = {reporter.rows.size() - 1, impl};
        reporter.flops_per_iter[name] = flops;
        benchmark::RegisterBenchmark(name.c_str(),
                                     [o, s, p, impl, flops](benchmark::State& st) {
                                       for (auto _ : st) {
                                         if (impl == Impl::kLoom) run_loom(*o, p);
                                         if (impl == Impl::kBlas) run_blas(*o, s, p);
                                         if (impl == Impl::kEigen) run_eigen(*o, s, p);
                                         benchmark::ClobberMemory();
                                       }
                                       st.counters["FLOP/s"] = benchmark::Counter(
                                           flops, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
                                     })
            ->MinTime(0.5)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  loom::bench::add_isa_context();
  // GPT-2 124M at batch·seq = 256 rows: qkv, mlp up, mlp down, lm head (vocab padded to 50304).
  const std::vector<loom::LinearShape> shapes = {
      {256, 768, 2304}, {256, 768, 3072}, {256, 3072, 768}, {256, 768, 50304}};
  loom::Generator gen(1234);
  std::vector<std::unique_ptr<loom::Operands>> operands;
  for (const auto& s : shapes) operands.push_back(std::make_unique<loom::Operands>(s, gen));
  loom::TableReporter reporter;
  loom::register_all(shapes, operands, reporter);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_table();
  benchmark::Shutdown();
  return 0;
}
