// tests/cuda/attention_block_kernel_test.cpp — the CUDA block-attention kernels of ring
// attention (kernels/cuda/attention_block.cu) against the CPU kernels: forward (out, lse),
// merge and backward (dq, dk, dv), for f32, bf16 and f16, on query/key blocks at global
// offsets: on the diagonal, Tq ≠ Tk with a shifted mask, entirely in the past (nothing
// masked), entirely in the future (everything masked: out 0, lse −inf), partly masked rows,
// lengths that do not divide the tiles (16, 8 and 32 rows), grouped-query heads, and head
// sizes 64, 128 and 40 (odd multiple of 8, not of 32).
// Inputs are fresh normals from a fresh seed each run (printed on failure); forward outputs
// are poisoned first; merge starts from a running result with some rows still empty (lse
// −inf); backward gradients start from random contents of the size of the increment, so a
// kernel that overwrites, or adds a wrong increment, fails. Uses only Loom's API (no CUDA
// headers); every test skips itself, with the reason, when the process sees no CUDA device.
//
// Reference: the CPU kernel in f64 on the very values the GPU reads (16-bit inputs upcast, lse
// and delta as the f32 the GPU reads), so only the GPU's own rounding is measured. lse and
// delta are f32 on CUDA for every dtype (Note [Attention block kernel contract]).
// Tolerances, relative L2 error over the finite entries (DESIGN §3):
//   out, dq, dk, dv, merged out: f32 1e-5; bf16, f16 1e-2 (results rounded to 16 bits);
//   lse, merged lse: 1e-5 for f32 inputs, 1e-4 for 16-bit inputs (f32 math on exact
//   products of the 16-bit values). −inf entries must match exactly; NaN never passes.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/attention_block.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaAttentionBlockTest = CudaTest;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double result_tol(DType dt) { return dt == DType::kF32 ? 1e-5 : 1e-2; }
double lse_tol(DType dt) { return dt == DType::kF32 ? 1e-5 : 1e-4; }

// One block pair: queries at global positions q_offset…, keys at k_offset….
struct Geometry {
  int64_t tq, tk, q_offset, k_offset;
  const char* what;
};

// Every kind of block ring attention meets, and the awkward lengths.
const std::vector<Geometry> kGeometries = {
    {37, 37, 64, 64, "diagonal"},
    {50, 77, 100, 60, "Tq<Tk, shifted mask"},
    {33, 70, 200, 0, "past (no mask)"},
    {45, 29, 0, 100, "future (fully masked)"},
    {70, 40, 10, 40, "first rows see nothing"},
    {129, 65, 96, 90, "several tiles, Tq>Tk"},
    {1, 1, 5, 5, "one row, one key"},
};

struct Case {
  DType dtype;
  int64_t b, hq, hkv, d;
  Geometry g;
  std::string str() const {
    return std::string(dtype_name(dtype)) + " B=" + std::to_string(b) +
           " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d) +
           " Tq=" + std::to_string(g.tq) + " Tk=" + std::to_string(g.tk) +
           " q_offset=" + std::to_string(g.q_offset) + " k_offset=" + std::to_string(g.k_offset) +
           " (" + g.what + ")";
  }
  Shape q_shape() const { return {b, hq, g.tq, d}; }
  Shape kv_shape() const { return {b, hkv, g.tk, d}; }
  Shape row_shape() const { return {b, hq, g.tq}; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(d)); }
};

// Every geometry with D ∈ {64, 128, 40} and Hq = 4 over Hkv ∈ {4, 2, 1}.
std::vector<Case> cases(DType dt) {
  std::vector<Case> out;
  for (const Geometry& g : kGeometries) {
    for (int64_t d : {64, 128, 40}) {
      for (int64_t hkv : {4, 2, 1}) out.push_back({dt, 2, 4, hkv, d, g});
    }
  }
  return out;
}

// ‖got − want‖ / ‖want‖ over the entries where want is finite; the entries where want is −inf
// must be −inf in got too (and NaN in got never passes). Fails with `what` otherwise.
void expect_close_with_inf(const Tensor& want, const Tensor& got, double tol,
                           const std::string& what) {
  const std::vector<double> a = want.to(Device::cpu()).contiguous().to_vector();
  const std::vector<double> b = got.to(Device::cpu()).contiguous().to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i])) {
      ASSERT_EQ(a[i], b[i]) << what << ": element " << i;
      continue;
    }
    ASSERT_TRUE(std::isfinite(b[i])) << what << ": element " << i << " is " << b[i];
    num += (b[i] - a[i]) * (b[i] - a[i]);
    den += a[i] * a[i];
  }
  const double err = den == 0.0 ? (num == 0.0 ? 0.0 : std::sqrt(num)) : std::sqrt(num / den);
  EXPECT_LE(err, tol) << what << ": relative error";
}

double rms(const Tensor& x) {
  const std::vector<double> v = x.to_vector();
  double s = 0.0;
  for (double e : v) s += e * e;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

Tensor f64(const Tensor& x) { return x.to(Device::cpu()).to(DType::kF64); }

struct Inputs {
  Tensor q, k, v;  // CPU, the case's dtype
};

Inputs make_inputs(const Case& c, Generator& gen) {
  return {randn(c.q_shape(), gen, c.dtype), randn(c.kv_shape(), gen, c.dtype),
          randn(c.kv_shape(), gen, c.dtype)};
}

// The CPU kernel in f64 on the inputs' values: out (B,Hq,Tq,D) and lse (B,Hq,Tq).
void cpu_forward(const Case& c, const Inputs& in, Tensor& out, Tensor& lse) {
  out = Tensor::empty(c.q_shape(), DType::kF64);
  lse = Tensor::empty(c.row_shape(), DType::kF64);
  kernels::call_kernel<kernels::attention_block_forward_k>(
      f64(in.q), f64(in.k), f64(in.v), c.g.q_offset, c.g.k_offset, c.scale(), out, lse);
}

void check_forward(const Case& c, Generator& gen) {
  SCOPED_TRACE(c.str());
  const Inputs in = make_inputs(c, gen);
  Tensor out_ref, lse_ref;
  cpu_forward(c, in, out_ref, lse_ref);
  Tensor out = poisoned_cuda(c.q_shape(), c.dtype);
  Tensor lse = poisoned_cuda(c.row_shape(), DType::kF32);
  kernels::call_kernel<kernels::attention_block_forward_k>(
      in.q.to(Device::cuda()), in.k.to(Device::cuda()), in.v.to(Device::cuda()), c.g.q_offset,
      c.g.k_offset, c.scale(), out, lse);
  expect_close_with_inf(out_ref, out, result_tol(c.dtype), "out");
  expect_close_with_inf(lse_ref, lse, lse_tol(c.dtype), "lse");
}

// Merge: a running (out, lse) with every third row still empty (lse −inf, out 0, as ring
// attention starts) merged with a block result whose every fifth row saw no key (−inf, left
// as is). lse values are spread around log Tk so neither side dominates.
void check_merge(const Case& c, Generator& gen) {
  SCOPED_TRACE(c.str());
  const int64_t rows = c.b * c.hq * c.g.tq;
  Tensor out = randn(c.q_shape(), gen, c.dtype);
  const Tensor block_out = randn(c.q_shape(), gen, c.dtype);
  std::vector<double> lse_v = randn({rows}, gen, DType::kF32, 3.0, 2.0).to_vector();
  std::vector<double> blse_v = randn({rows}, gen, DType::kF32, 3.0, 2.0).to_vector();
  std::vector<double> out_v = out.to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 3 == 0) {
      lse_v[r] = kNegInf;
      for (int64_t e = 0; e < c.d; ++e) out_v[r * c.d + e] = 0.0;
    }
    if (r % 5 == 1) blse_v[r] = kNegInf;
  }
  out = Tensor::from_vector(out_v, c.q_shape()).to(c.dtype);
  const Tensor lse = Tensor::from_vector(lse_v, c.row_shape()).to(DType::kF32);
  const Tensor block_lse = Tensor::from_vector(blse_v, c.row_shape()).to(DType::kF32);

  Tensor out_ref = f64(out).clone(), lse_ref = f64(lse).clone();
  kernels::call_kernel<kernels::attention_block_merge_k>(out_ref, lse_ref, f64(block_out),
                                                         f64(block_lse));
  Tensor out_gpu = out.to(Device::cuda()), lse_gpu = lse.to(Device::cuda());
  kernels::call_kernel<kernels::attention_block_merge_k>(
      out_gpu, lse_gpu, block_out.to(Device::cuda()), block_lse.to(Device::cuda()));
  expect_close_with_inf(out_ref, out_gpu, result_tol(c.dtype), "merged out");
  expect_close_with_inf(lse_ref, lse_gpu, lse_tol(c.dtype), "merged lse");
}

// Backward with a FINAL lse as ring attention passes it: this block's lse merged with that of
// other blocks (random, around log Tk, so every row is finite and p ≤ 1), and a delta of
// fresh normals (any value exercises the arithmetic).
struct Grads {
  Tensor dq, dk, dv;
};

void check_backward(const Case& c, Generator& gen) {
  SCOPED_TRACE(c.str());
  const Inputs in = make_inputs(c, gen);
  Tensor out_ref, lse_block;
  cpu_forward(c, in, out_ref, lse_block);
  const int64_t rows = c.b * c.hq * c.g.tq;
  std::vector<double> lse_v = lse_block.to_vector();
  const std::vector<double> other =
      randn({rows}, gen, DType::kF64, std::log(static_cast<double>(c.g.tk)), 1.0).to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    const double a = lse_v[r], b = other[r];
    const double m = std::max(a, b);
    lse_v[r] = m + std::log(std::exp(a - m) + std::exp(b - m));
  }
  const Tensor lse = Tensor::from_vector(lse_v, c.row_shape()).to(DType::kF32);
  const Tensor delta = randn(c.row_shape(), gen, DType::kF32);
  const Tensor dout = randn(c.q_shape(), gen, c.dtype);

  const auto cpu_backward = [&](Grads& g) {
    kernels::call_kernel<kernels::attention_block_backward_k>(
        f64(in.q), f64(in.k), f64(in.v), f64(lse), f64(delta), f64(dout), c.g.q_offset,
        c.g.k_offset, c.scale(), g.dq, g.dk, g.dv);
  };
  Grads inc{Tensor::zeros(c.q_shape(), DType::kF64), Tensor::zeros(c.kv_shape(), DType::kF64),
            Tensor::zeros(c.kv_shape(), DType::kF64)};
  cpu_backward(inc);
  const Grads start{randn(c.q_shape(), gen, c.dtype, 0.0, rms(inc.dq) + 1e-3),
                    randn(c.kv_shape(), gen, c.dtype, 0.0, rms(inc.dk) + 1e-3),
                    randn(c.kv_shape(), gen, c.dtype, 0.0, rms(inc.dv) + 1e-3)};
  Grads ref{f64(start.dq).clone(), f64(start.dk).clone(), f64(start.dv).clone()};
  cpu_backward(ref);

  Grads gpu{start.dq.to(Device::cuda()), start.dk.to(Device::cuda()), start.dv.to(Device::cuda())};
  kernels::call_kernel<kernels::attention_block_backward_k>(
      in.q.to(Device::cuda()), in.k.to(Device::cuda()), in.v.to(Device::cuda()),
      lse.to(Device::cuda()), delta.to(Device::cuda()), dout.to(Device::cuda()), c.g.q_offset,
      c.g.k_offset, c.scale(), gpu.dq, gpu.dk, gpu.dv);
  expect_close_with_inf(ref.dq, gpu.dq, result_tol(c.dtype), "dq");
  expect_close_with_inf(ref.dk, gpu.dk, result_tol(c.dtype), "dk");
  expect_close_with_inf(ref.dv, gpu.dv, result_tol(c.dtype), "dv");
}

class CudaAttentionBlockSeededTest : public CudaAttentionBlockTest {
 protected:
  const uint64_t seed_ = fresh_seed();
  Generator gen_{seed_};
  void SetUp() override {
    CudaAttentionBlockTest::SetUp();
    RecordProperty("seed", std::to_string(seed_));
  }
  std::string seed_str() const { return "seed " + std::to_string(seed_); }
};

TEST_F(CudaAttentionBlockSeededTest, ForwardMatchesCpu) {
  SCOPED_TRACE(seed_str());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : cases(dt)) check_forward(c, gen_);
  }
}

TEST_F(CudaAttentionBlockSeededTest, MergeMatchesCpu) {
  SCOPED_TRACE(seed_str());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Geometry& g : {kGeometries[0], kGeometries[5], kGeometries[6]}) {
      for (int64_t d : {64, 128, 40}) check_merge(Case{dt, 2, 4, 4, d, g}, gen_);
    }
  }
}

TEST_F(CudaAttentionBlockSeededTest, BackwardMatchesCpu) {
  SCOPED_TRACE(seed_str());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : cases(dt)) check_backward(c, gen_);
  }
}

// Forward, merge and backward on a fully masked block leave everything as the contract says:
// out 0 and lse −inf, the running result untouched, the gradients unchanged bit for bit.
TEST_F(CudaAttentionBlockSeededTest, FullyMaskedBlockChangesNothing) {
  SCOPED_TRACE(seed_str());
  const Case c{DType::kBF16, 1, 4, 2, 40, {21, 19, 0, 30, "future"}};
  const Inputs in = make_inputs(c, gen_);
  const Tensor q = in.q.to(Device::cuda()), k = in.k.to(Device::cuda()),
               v = in.v.to(Device::cuda());
  Tensor block_out = poisoned_cuda(c.q_shape(), c.dtype);
  Tensor block_lse = poisoned_cuda(c.row_shape(), DType::kF32);
  kernels::call_kernel<kernels::attention_block_forward_k>(q, k, v, c.g.q_offset, c.g.k_offset,
                                                           c.scale(), block_out, block_lse);
  expect_same_bits(Tensor::zeros(c.q_shape(), c.dtype), block_out, "out");
  expect_same_bits(Tensor::full(c.row_shape(), kNegInf, DType::kF32), block_lse, "lse");

  const Tensor out0 = randn(c.q_shape(), gen_, c.dtype);
  const Tensor lse0 = randn(c.row_shape(), gen_, DType::kF32);
  Tensor out = out0.to(Device::cuda()), lse = lse0.to(Device::cuda());
  kernels::call_kernel<kernels::attention_block_merge_k>(out, lse, block_out, block_lse);
  expect_same_bits(out0, out, "merged out");
  expect_same_bits(lse0, lse, "merged lse");

  const Tensor dq0 = randn(c.q_shape(), gen_, c.dtype), dk0 = randn(c.kv_shape(), gen_, c.dtype),
               dv0 = randn(c.kv_shape(), gen_, c.dtype);
  Tensor dq = dq0.to(Device::cuda()), dk = dk0.to(Device::cuda()), dv = dv0.to(Device::cuda());
  kernels::call_kernel<kernels::attention_block_backward_k>(
      q, k, v, lse, randn(c.row_shape(), gen_, DType::kF32).to(Device::cuda()),
      randn(c.q_shape(), gen_, c.dtype).to(Device::cuda()), c.g.q_offset, c.g.k_offset, c.scale(),
      dq, dk, dv);
  expect_same_bits(dq0, dq, "dq");
  expect_same_bits(dk0, dk, "dk");
  expect_same_bits(dv0, dv, "dv");
}

// The same calls twice give the same bits: no atomics, no order-dependent sums (dk, dv sum
// the query heads of a kv group).
TEST_F(CudaAttentionBlockSeededTest, ResultsAreBitwiseReproducible) {
  SCOPED_TRACE(seed_str());
  for (const Case& c : {Case{DType::kBF16, 2, 4, 1, 64, kGeometries[1]},
                        Case{DType::kF32, 2, 4, 2, 40, kGeometries[5]}}) {
    SCOPED_TRACE(c.str());
    const Inputs in = make_inputs(c, gen_);
    const Tensor q = in.q.to(Device::cuda()), k = in.k.to(Device::cuda()),
                 v = in.v.to(Device::cuda());
    const Tensor dout = randn(c.q_shape(), gen_, c.dtype).to(Device::cuda());
    const Tensor delta = randn(c.row_shape(), gen_, DType::kF32).to(Device::cuda());
    std::vector<Tensor> runs;  // out, lse, dq, dk, dv of each run
    for (int run = 0; run < 2; ++run) {
      Tensor out = poisoned_cuda(c.q_shape(), c.dtype);
      Tensor lse = poisoned_cuda(c.row_shape(), DType::kF32);
      kernels::call_kernel<kernels::attention_block_forward_k>(q, k, v, c.g.q_offset, c.g.k_offset,
                                                               c.scale(), out, lse);
      Tensor dq = Tensor::zeros(c.q_shape(), c.dtype, Device::cuda());
      Tensor dk = Tensor::zeros(c.kv_shape(), c.dtype, Device::cuda());
      Tensor dv = Tensor::zeros(c.kv_shape(), c.dtype, Device::cuda());
      kernels::call_kernel<kernels::attention_block_backward_k>(
          q, k, v, lse, delta, dout, c.g.q_offset, c.g.k_offset, c.scale(), dq, dk, dv);
      for (const Tensor& x : {out, lse, dq, dk, dv}) runs.push_back(x.to(Device::cpu()));
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (size_t i = 0; i < 5; ++i) expect_same_bits(runs[i], runs[i + 5], names[i]);
    EXPECT_GT(rms(runs[3]), 0.0) << "dk must not be all zeros";
  }
}

TEST_F(CudaAttentionBlockTest, RejectsUnsupportedInput) {
  Generator gen(401);
  // f64 is not supported on cuda.
  const Tensor q64 = randn({1, 2, 5, 8}, gen, DType::kF64).to(Device::cuda());
  Tensor out64 = poisoned_cuda({1, 2, 5, 8}, DType::kF64);
  Tensor lse64 = poisoned_cuda({1, 2, 5}, DType::kF64);
  EXPECT_THROW(kernels::call_kernel<kernels::attention_block_forward_k>(q64, q64, q64, 0, 0, 0.5,
                                                                        out64, lse64),
               Error);
  // Head size above 128.
  const Tensor q = randn({1, 2, 5, 136}, gen, DType::kF32).to(Device::cuda());
  Tensor out = poisoned_cuda({1, 2, 5, 136}, DType::kF32);
  Tensor lse = poisoned_cuda({1, 2, 5}, DType::kF32);
  EXPECT_THROW(
      kernels::call_kernel<kernels::attention_block_forward_k>(q, q, q, 0, 0, 0.5, out, lse),
      Error);
  // lse of a 16-bit block is f32, not the inputs' dtype.
  const Tensor qb = randn({1, 2, 5, 8}, gen, DType::kBF16).to(Device::cuda());
  Tensor outb = poisoned_cuda({1, 2, 5, 8}, DType::kBF16);
  Tensor lseb = poisoned_cuda({1, 2, 5}, DType::kBF16);
  EXPECT_THROW(
      kernels::call_kernel<kernels::attention_block_forward_k>(qb, qb, qb, 0, 0, 0.5, outb, lseb),
      Error);
  EXPECT_THROW(kernels::call_kernel<kernels::attention_block_merge_k>(outb, lseb, outb, lseb),
               Error);
}

}  // namespace
}  // namespace loom
