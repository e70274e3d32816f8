// tests/cuda/norm_kernel_test.cpp — the CUDA LayerNorm, RMSNorm and residual add + LayerNorm
// kernels (kernels/cuda/norm.cu) against the CPU kernels: fresh random inputs each run (the seed
// is printed on failure), outputs poisoned, accumulators (dx, dweight, dbias) random, odd N and
// C, rows too long for the shared-memory paths, misaligned rows; the backward must give the same
// bits twice. f32/f64 are compared with the CPU kernel on the same values; bf16/f16 with the CPU
// kernel on the values widened to f32 (their statistics are f32 on both sides). Tolerances, as
// relative errors (DESIGN §3): f32 1e-5, f64 1e-12, bf16/f16 1e-2 (statistics 1e-5 for all but
// f64). Skips without a GPU.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/norm.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaNormTest = CudaTest;

constexpr double kEps = 1e-5;

enum class Kind { kLayerNorm, kLayerNormNoBias, kRmsNorm, kResidual, kResidualNoBias };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kLayerNorm:
      return "layer_norm";
    case Kind::kLayerNormNoBias:
      return "layer_norm (no bias)";
    case Kind::kRmsNorm:
      return "rms_norm";
    case Kind::kResidual:
      return "residual_layer_norm";
    case Kind::kResidualNoBias:
      return "residual_layer_norm (no bias)";
  }
  return "?";
}

bool has_bias(Kind k) { return k == Kind::kLayerNorm || k == Kind::kResidual; }
bool is_residual(Kind k) { return k == Kind::kResidual || k == Kind::kResidualNoBias; }

double stat_tol(DType dt) { return dt == DType::kF64 ? 1e-12 : 1e-5; }

Tensor poisoned(const Shape& shape, DType dt, bool misalign) {
  return to_gpu(Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), dt), misalign);
}

void expect_close(const Tensor& want, const Tensor& got, double tolerance,
                  const std::string& what) {
  const double err = rel_error(want, got);
  EXPECT_LT(err, tolerance) << what;
}

// Row means may cancel to about 0, so a relative error could exceed any tolerance by rounding
// alone; their error is measured against the scale of the data they average instead:
// ‖got − want‖ / (√N · rms(x)). NaN never passes.
double mean_error(const Tensor& want, const Tensor& got, const Tensor& x) {
  const std::vector<double> a = want.to(Device::cpu()).to_vector();
  const std::vector<double> b = got.to(Device::cpu()).to_vector();
  const std::vector<double> xs = x.to(Device::cpu()).to_vector();
  double num = 0, sq = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    num += (b[i] - a[i]) * (b[i] - a[i]);
  }
  for (double v : xs) sq += v * v;
  const double den = sq / static_cast<double>(xs.size()) * static_cast<double>(a.size());
  return den > 0 ? std::sqrt(num / den)
                 : (num == 0 ? 0.0 : std::numeric_limits<double>::infinity());
}

// dx against the size of the terms it is made of: dx += rstd·(g − mean(g) − x̂·mean(g·x̂)), g =
// dy·w. A row whose variance is 0 (C = 1) has x̂ = 0 and g − mean(g) = 0 exactly, and rstd = 1/√eps
// (~316) magnifies the rounding of g (one fused multiply-add more or less) far past a relative
// tolerance against dx (seen on the first GPU run); so the error is ‖got − want‖ over
// max(‖want‖, ‖rstd·g‖). NaN never passes.
double dx_error(const Tensor& want, const Tensor& got, const Tensor& dy, const Tensor& w,
                const Tensor& rstd, int64_t n, int64_t c) {
  const std::vector<double> g = dy.to(Device::cpu()).to_vector();
  const std::vector<double> wv = w.to(Device::cpu()).to_vector();
  const std::vector<double> r = rstd.to(Device::cpu()).to_vector();
  double terms = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      const double t = r[static_cast<size_t>(i)] * g[static_cast<size_t>(i * c + j)] *
                       wv[static_cast<size_t>(j)];
      terms += t * t;
    }
  }
  const double base = rel_error(want, got);
  const std::vector<double> a = want.to(Device::cpu()).to_vector();
  double sq = 0;
  for (double v : a) sq += v * v;
  if (!std::isfinite(base) || terms <= sq) return base;
  return base * std::sqrt(sq / terms);
}

// One forward and backward of `kind` at (n, c) in dtype dt, CUDA against CPU.
void run_case(Kind kind, DType dt, int64_t n, int64_t c, Generator& gen, bool misalign = false) {
  const std::string what = std::string(kind_name(kind)) + " " + dtype_name(dt) +
                           " N=" + std::to_string(n) + " C=" + std::to_string(c) +
                           (misalign ? " misaligned" : "");
  SCOPED_TRACE(what);
  const Shape rows{n, c}, cols{c}, stats{n};
  const DType sd = kernels::norm_stat_dtype(dt);
  const bool residual = is_residual(kind), center = kind != Kind::kRmsNorm;
  const Tensor x = random_tensor(rows, dt, gen), r = random_tensor(rows, dt, gen);
  const Tensor w = random_tensor(cols, dt, gen), b = random_tensor(cols, dt, gen);
  const Tensor dy = random_tensor(rows, dt, gen), ds = random_tensor(rows, dt, gen);
  const Tensor dx0 = random_tensor(rows, dt, gen), dw0 = random_tensor(cols, dt, gen);
  const Tensor db0 = random_tensor(cols, dt, gen);

  // GPU forward.
  const Tensor gx = to_gpu(x, misalign), gr = to_gpu(r, misalign), gw = to_gpu(w, false);
  const Tensor gb = has_bias(kind) ? to_gpu(b, false) : Tensor();
  Tensor gy = poisoned(rows, dt, misalign), gs = poisoned(rows, dt, misalign);
  Tensor gmean = poisoned(stats, sd, false), grstd = poisoned(stats, sd, false);
  if (residual) {
    kernels::call_kernel<kernels::residual_layer_norm_forward_k>(gx, gr, gw, gb, kEps, gs, gy,
                                                                 gmean, grstd);
  } else if (center) {
    kernels::call_kernel<kernels::layer_norm_forward_k>(gx, gw, gb, kEps, gy, gmean, grstd);
  } else {
    kernels::call_kernel<kernels::rms_norm_forward_k>(gx, gw, kEps, gy, grstd);
  }

  // CPU reference forward. The residual sum is checked first; for bf16/f16 the reference
  // LayerNorm then runs on the GPU's rounded sum (the values the GPU normalised).
  const Tensor rw = to_ref(w), rb = has_bias(kind) ? to_ref(b) : Tensor();
  Tensor rin = to_ref(x);
  const DType rdt = rin.dtype();
  if (residual) {
    // (Its y and statistics are those of layer_norm_forward on rs, checked below.)
    Tensor rs = Tensor::empty(rows, rdt), sum_y = Tensor::empty(rows, rdt);
    Tensor sum_mean = Tensor::empty(stats, rdt), sum_rstd = Tensor::empty(stats, rdt);
    kernels::call_kernel<kernels::residual_layer_norm_forward_k>(rin, to_ref(r), rw, rb, kEps, rs,
                                                                 sum_y, sum_mean, sum_rstd);
    expect_close(rs, gs, tol(dt), "sum");
    rin = is_half(dt) ? to_ref(gs) : rs;
  }
  Tensor ry = Tensor::empty(rows, rdt), rmean = Tensor::empty(stats, rdt);
  Tensor rrstd = Tensor::empty(stats, rdt);
  if (center) {
    kernels::call_kernel<kernels::layer_norm_forward_k>(rin, rw, rb, kEps, ry, rmean, rrstd);
    EXPECT_LT(mean_error(rmean, gmean, rin), stat_tol(dt)) << "mean";
  } else {
    kernels::call_kernel<kernels::rms_norm_forward_k>(rin, rw, kEps, ry, rrstd);
  }
  expect_close(rrstd, grstd, stat_tol(dt), "rstd");
  expect_close(ry, gy, tol(dt), "y");

  // Backward, accumulating into random dx, dweight, dbias; the GPU one twice (same bits).
  const Tensor rdy = to_ref(dy), rds = residual ? to_ref(ds) : Tensor();
  Tensor rdx = to_ref(dx0), rdw = to_ref(dw0), rdb = has_bias(kind) ? to_ref(db0) : Tensor();
  if (residual) {
    kernels::call_kernel<kernels::residual_layer_norm_backward_k>(rdy, rds, rin, rw, rmean, rrstd,
                                                                  rdx, rdw, rdb);
  } else if (center) {
    kernels::call_kernel<kernels::layer_norm_backward_k>(rdy, rin, rw, rmean, rrstd, rdx, rdw, rdb);
  } else {
    kernels::call_kernel<kernels::rms_norm_backward_k>(rdy, rin, rw, rrstd, rdx, rdw);
  }
  const Tensor gdy = to_gpu(dy, misalign), gds = residual ? to_gpu(ds, misalign) : Tensor();
  Tensor first[3];
  for (int rep = 0; rep < 2; ++rep) {
    Tensor gdx = to_gpu(dx0, misalign), gdw = to_gpu(dw0, false);
    Tensor gdb = has_bias(kind) ? to_gpu(db0, false) : Tensor();
    if (residual) {
      kernels::call_kernel<kernels::residual_layer_norm_backward_k>(gdy, gds, gs, gw, gmean, grstd,
                                                                    gdx, gdw, gdb);
    } else if (center) {
      kernels::call_kernel<kernels::layer_norm_backward_k>(gdy, gx, gw, gmean, grstd, gdx, gdw,
                                                           gdb);
    } else {
      kernels::call_kernel<kernels::rms_norm_backward_k>(gdy, gx, gw, grstd, gdx, gdw);
    }
    if (rep == 0) {
      EXPECT_LT(dx_error(rdx, gdx, rdy, rw, rrstd, n, c), tol(dt)) << "dx";
      expect_close(rdw, gdw, tol(dt), "dweight");
      if (has_bias(kind)) expect_close(rdb, gdb, tol(dt), "dbias");
      first[0] = gdx.to(Device::cpu());
      first[1] = gdw.to(Device::cpu());
      if (has_bias(kind)) first[2] = gdb.to(Device::cpu());
    } else {
      expect_same_bits(first[0], gdx, what + " dx, second run");
      expect_same_bits(first[1], gdw, what + " dweight, second run");
      if (has_bias(kind)) expect_same_bits(first[2], gdb, what + " dbias, second run");
    }
  }
}

const std::vector<int64_t> kRows = {1, 3, 17, 65};
const std::vector<int64_t> kCols = {1, 3, 17, 65, 769, 1600, 4099};

void run_grid(Kind kind) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType dt : kFloatDTypes) {
    for (int64_t n : kRows) {
      for (int64_t c : kCols) run_case(kind, dt, n, c, gen);
    }
  }
}

TEST_F(CudaNormTest, LayerNormMatchesCpu) { run_grid(Kind::kLayerNorm); }
TEST_F(CudaNormTest, LayerNormWithoutBiasMatchesCpu) { run_grid(Kind::kLayerNormNoBias); }
TEST_F(CudaNormTest, RmsNormMatchesCpu) { run_grid(Kind::kRmsNorm); }
TEST_F(CudaNormTest, ResidualLayerNormMatchesCpu) { run_grid(Kind::kResidual); }
TEST_F(CudaNormTest, ResidualLayerNormWithoutBiasMatchesCpu) { run_grid(Kind::kResidualNoBias); }

// Wide rows (Llama-8B's 4096, widths at the shared-memory opt-in's edge, and beyond), many rows
// (many gradient chunks), rows too long for the shared-memory row cache (f32 C = 30001: the forward
// re-reads global memory, the backward also keeps its partial sums in global memory; f64 C = 13000:
// cache off, sums in shared).
TEST_F(CudaNormTest, LargeRowsAndUncachedPathsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (Kind kind : {Kind::kLayerNorm, Kind::kRmsNorm, Kind::kResidual}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      run_case(kind, dt, 2, 8192, gen);
      // Dynamic shared memory just under 48 KiB beside the static scratch (the opt-in's edge,
      // kernels/cuda/row_io.cuh): backward at 4096 (RMSNorm) and 3072 (with bias), forward at
      // 12288.
      for (int64_t c : {int64_t{3072}, int64_t{4096}, int64_t{12288}})
        run_case(kind, dt, 2, c, gen);
      run_case(kind, dt, 4099, 769, gen);
      run_case(kind, dt, 5, 30001, gen);
    }
    run_case(kind, DType::kF64, 3, 13000, gen);
    for (int64_t c : {int64_t{1536}, int64_t{2048}, int64_t{6144}})
      run_case(kind, DType::kF64, 2, c, gen);
  }
}

// Rows whose length is a multiple of the 16-byte pack but whose data is not 16-byte aligned
// take the element-wise path.
TEST_F(CudaNormTest, MisalignedRowsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (Kind kind : {Kind::kLayerNorm, Kind::kRmsNorm, Kind::kResidual}) {
    for (DType dt : kFloatDTypes) run_case(kind, dt, 17, 1600, gen, true);
  }
}

TEST_F(CudaNormTest, WrongStatisticsDTypeIsRefused) {
  const Tensor x = Tensor::ones({2, 8}, DType::kBF16, Device::cuda());
  const Tensor w = Tensor::ones({8}, DType::kBF16, Device::cuda());
  Tensor y = Tensor::empty({2, 8}, DType::kBF16, Device::cuda());
  Tensor mean = Tensor::empty({2}, DType::kBF16, Device::cuda());
  Tensor rstd = Tensor::empty({2}, DType::kBF16, Device::cuda());
  EXPECT_THROW(
      kernels::call_kernel<kernels::layer_norm_forward_k>(x, w, Tensor(), kEps, y, mean, rstd),
      Error);
}

}  // namespace
}  // namespace loom
