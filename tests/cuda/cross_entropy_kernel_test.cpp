// tests/cuda/cross_entropy_kernel_test.cpp — the CUDA softmax cross-entropy kernels
// (kernels/cuda/cross_entropy.cu) against the CPU kernels on fresh random inputs (the seed is
// printed on failure): GPT-2 and Llama vocabularies, padded vocab, ignored targets, odd and
// misaligned row lengths, every logits dtype and several target dtypes. The CPU reference for
// bf16/f16 logits runs on the values upcast to f32. Tolerances (relative error, NaN never
// passes): loss and lse 1e-5 (f32 math against the CPU's double; 1e-12 for f64 logits);
// dlogits 1e-5 for f32, 1e-12 for f64, 1e-2 for bf16/f16 (stored rounding). Padding columns and
// ignored rows must keep their previous gradient bit for bit (the backward accumulates).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cross_entropy.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers

struct CeCase {
  int64_t rows, vp, vocab;
  DType logits, targets;
  int64_t ignore_index;
  double logit_std;
};

DType row_dtype(DType logits) { return logits == DType::kF64 ? DType::kF64 : DType::kF32; }
DType ref_dtype(DType logits) { return logits == DType::kF64 ? DType::kF64 : DType::kF32; }

std::string label(const CeCase& c) {
  return std::string(dtype_name(c.logits)) + " rows " + std::to_string(c.rows) + " vp " +
         std::to_string(c.vp) + " vocab " + std::to_string(c.vocab) + " targets " +
         dtype_name(c.targets);
}

// Targets in [0, vocab) with about a quarter set to ignore_index; `ignored` lists those rows.
Tensor make_targets(const CeCase& c, Generator& gen, std::vector<int64_t>& ignored) {
  const std::vector<double> t = randint({c.rows}, 0, c.vocab, gen).to_vector();
  const std::vector<double> coin = randint({c.rows}, 0, 4, gen).to_vector();
  std::vector<int64_t> v(t.size());
  for (size_t r = 0; r < t.size(); ++r) {
    const bool ignore = coin[r] == 0.0 && r != 0;  // row 0 always counts
    v[r] = ignore ? c.ignore_index : static_cast<int64_t>(t[r]);
    if (ignore) ignored.push_back(static_cast<int64_t>(r));
  }
  return Tensor::from_vector<int64_t>(v, {c.rows}).to(c.targets);
}

class CudaCrossEntropyTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    seed_ = std::random_device{}();
  }
  uint64_t seed_ = 0;
};

void check_case(const CeCase& c, Generator& gen) {
  const std::string what = label(c);
  const DType rd = ref_dtype(c.logits), rowd = row_dtype(c.logits);
  std::vector<int64_t> ignored;
  const Tensor logits = randn({c.rows, c.vp}, gen, c.logits, 0.0, c.logit_std);
  const Tensor targets = make_targets(c, gen, ignored);
  const int64_t count = c.rows - static_cast<int64_t>(ignored.size());

  // Forward.
  Tensor want_loss = Tensor::empty({c.rows}, rowd), want_lse = Tensor::empty({c.rows}, rowd);
  const Tensor ref_logits = logits.to(rd);
  kernels::call_kernel<kernels::cross_entropy_forward_k>(ref_logits, targets, c.ignore_index,
                                                         c.vocab, want_loss, want_lse);
  const Tensor g_logits = logits.to(Device::cuda()), g_targets = targets.to(Device::cuda());
  Tensor got_loss = poisoned_cuda({c.rows}, rowd), got_lse = poisoned_cuda({c.rows}, rowd);
  kernels::call_kernel<kernels::cross_entropy_forward_k>(g_logits, g_targets, c.ignore_index,
                                                         c.vocab, got_loss, got_lse);
  const double row_tol = c.logits == DType::kF64 ? 1e-12 : 1e-5;
  EXPECT_LT(rel_error(want_loss, got_loss), row_tol) << "loss " << what;
  EXPECT_LT(rel_error(want_lse, got_lse), row_tol) << "lse " << what;
  const Tensor host_loss = got_loss.to(Device::cpu()), host_lse = got_lse.to(Device::cpu());
  for (int64_t r : ignored) {
    EXPECT_EQ(host_loss.at({r}), 0.0) << "ignored row " << r << " " << what;
    EXPECT_EQ(host_lse.at({r}), 0.0) << "ignored row " << r << " " << what;
  }

  // Backward, accumulating into small random gradients (the size of the increments, so both
  // an overwrite and a missing increment show).
  const double dloss_value = 0.5 + static_cast<double>(c.rows % 7) / 10.0;
  const double grad_scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  const Tensor d0 = randn({c.rows, c.vp}, gen, c.logits, 0.0, 1e-2 * grad_scale * dloss_value);
  Tensor want_d = d0.to(rd).clone();
  kernels::call_kernel<kernels::cross_entropy_backward_k>(
      ref_logits, targets, want_lse, Tensor::scalar(dloss_value, rowd), grad_scale, c.ignore_index,
      c.vocab, want_d);
  Tensor got_d = d0.to(Device::cuda());
  kernels::call_kernel<kernels::cross_entropy_backward_k>(
      g_logits, g_targets, got_lse, Tensor::scalar(dloss_value, rowd, Device::cuda()), grad_scale,
      c.ignore_index, c.vocab, got_d);
  const double d_tol = c.logits == DType::kF64 ? 1e-12 : c.logits == DType::kF32 ? 1e-5 : 1e-2;
  EXPECT_LT(rel_error(want_d, got_d), d_tol) << "dlogits " << what;
  if (c.vocab < c.vp) {
    expect_same_bits(d0.narrow(1, c.vocab, c.vp - c.vocab),
                     got_d.narrow(1, c.vocab, c.vp - c.vocab), "padding columns " + what);
  }
  for (int64_t r : ignored) {
    expect_same_bits(d0.narrow(0, r, 1), got_d.narrow(0, r, 1),
                     "ignored row " + std::to_string(r) + " " + what);
  }
}

TEST_F(CudaCrossEntropyTest, MatchesCpuAcrossVocabsDtypesAndLayouts) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  const std::vector<CeCase> cases = {
      {37, 50304, 50257, DType::kF32, DType::kI64, -100, 3.0},  // GPT-2, padded vocab
      {37, 50304, 50257, DType::kBF16, DType::kI32, -100, 3.0},
      {5, 128256, 128256, DType::kBF16, DType::kI64, -100, 3.0},  // Llama 3
      {5, 128256, 128256, DType::kF32, DType::kU32, 7, 3.0},
      {64, 1001, 1000, DType::kF32, DType::kI32, -1, 3.0},  // rows not 16-byte aligned
      {9, 1003, 997, DType::kF16, DType::kU16, 65535, 2.0},
      {17, 17, 13, DType::kBF16, DType::kI64, -100, 3.0},
      {7, 65, 60, DType::kF64, DType::kI64, -100, 3.0},
      {3, 1, 1, DType::kF32, DType::kI64, -100, 3.0},          // one-column rows
      {12, 4099, 4097, DType::kF32, DType::kI64, -100, 40.0},  // wide logits: rescaling
  };
  for (const CeCase& c : cases) check_case(c, gen);
}

TEST_F(CudaCrossEntropyTest, MaskedLogitsAtMinusInfinity) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  const int64_t rows = 6, vp = 515;
  Tensor logits = randn({rows, vp}, gen, DType::kF32, 0.0, 3.0);
  // Every other column of the first 200 is masked; targets are odd columns (never masked).
  std::vector<double> v = logits.to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < 200; j += 2) v[static_cast<size_t>(r * vp + j)] = -INFINITY;
  }
  std::vector<float> vf(v.begin(), v.end());
  logits = Tensor::from_vector<float>(vf, {rows, vp});
  const Tensor targets = Tensor::from_vector<int64_t>({1, 3, 5, 301, 513, 99}, {rows});
  Tensor want_loss = Tensor::empty({rows}), want_lse = Tensor::empty({rows});
  kernels::call_kernel<kernels::cross_entropy_forward_k>(logits, targets, -100, vp, want_loss,
                                                         want_lse);
  Tensor got_loss = poisoned_cuda({rows}, DType::kF32),
         got_lse = poisoned_cuda({rows}, DType::kF32);
  const Tensor g_logits = logits.to(Device::cuda()), g_targets = targets.to(Device::cuda());
  kernels::call_kernel<kernels::cross_entropy_forward_k>(g_logits, g_targets, -100, vp, got_loss,
                                                         got_lse);
  EXPECT_LT(rel_error(want_loss, got_loss), 1e-5);
  EXPECT_LT(rel_error(want_lse, got_lse), 1e-5);
  // The backward accumulates: both start from the same random values.
  const Tensor d0 = randn({rows, vp}, gen, DType::kF32, 0.0, 0.1);
  Tensor want_d = d0.clone();
  kernels::call_kernel<kernels::cross_entropy_backward_k>(
      logits, targets, want_lse, Tensor::scalar(1.0), 1.0 / rows, -100, vp, want_d);
  Tensor got_d = d0.to(Device::cuda());
  kernels::call_kernel<kernels::cross_entropy_backward_k>(
      g_logits, g_targets, got_lse, Tensor::scalar(1.0, DType::kF32, Device::cuda()), 1.0 / rows,
      -100, vp, got_d);
  EXPECT_LT(rel_error(want_d, got_d), 1e-5);
}

TEST_F(CudaCrossEntropyTest, DeterministicAcrossRuns) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  const int64_t rows = 16, vp = 50304, vocab = 50257;
  const Tensor logits = randn({rows, vp}, gen, DType::kBF16, 0.0, 3.0).to(Device::cuda());
  const Tensor targets = randint({rows}, 0, vocab, gen).to(Device::cuda());
  const Tensor dloss = Tensor::scalar(0.25, DType::kF32, Device::cuda());
  std::vector<Tensor> lse(2), d(2);
  for (int i = 0; i < 2; ++i) {
    Tensor loss = poisoned_cuda({rows}, DType::kF32);
    lse[i] = poisoned_cuda({rows}, DType::kF32);
    kernels::call_kernel<kernels::cross_entropy_forward_k>(logits, targets, -100, vocab, loss,
                                                           lse[i]);
    d[i] = Tensor::zeros({rows, vp}, DType::kBF16, Device::cuda());
    kernels::call_kernel<kernels::cross_entropy_backward_k>(logits, targets, lse[i], dloss,
                                                            1.0 / rows, -100, vocab, d[i]);
  }
  expect_same_bits(lse[0].to(Device::cpu()), lse[1], "lse twice");
  expect_same_bits(d[0].to(Device::cpu()), d[1], "dlogits twice");
}

TEST_F(CudaCrossEntropyTest, AllRowsIgnored) {
  Generator gen(std::random_device{}());
  const int64_t rows = 4, vp = 33;
  const Tensor logits = randn({rows, vp}, gen, DType::kF32, 0.0, 3.0).to(Device::cuda());
  const Tensor targets = Tensor::full({rows}, -100, DType::kI64, Device::cuda());
  Tensor loss = poisoned_cuda({rows}, DType::kF32), lse = poisoned_cuda({rows}, DType::kF32);
  kernels::call_kernel<kernels::cross_entropy_forward_k>(logits, targets, -100, vp, loss, lse);
  expect_same_bits(Tensor::zeros({rows}), loss, "loss");
  expect_same_bits(Tensor::zeros({rows}), lse, "lse");
  const Tensor d0 = randn({rows, vp}, gen, DType::kF32, 0.0, 1.0);
  Tensor d = d0.to(Device::cuda());
  kernels::call_kernel<kernels::cross_entropy_backward_k>(
      logits, targets, lse, Tensor::scalar(1.0, DType::kF32, Device::cuda()), 0.0, -100, vp, d);
  expect_same_bits(d0, d, "dlogits untouched");
}

// A NaN logit gives a NaN loss and lse as on the CPU wherever it sits — in particular as the
// first element of a thread's first 16-byte pack (row r's NaN at column 4·r·512 + … reaches
// each case: column 0, inside a pack, a later pack, the scalar tail).
TEST_F(CudaCrossEntropyTest, NanLogitGivesNanLoss) {
  Generator gen(std::random_device{}());
  const int64_t vp = 4099;
  const std::vector<int64_t> nan_cols = {0, 1, 2048, 4 * 512, 4 * 513 + 3, vp - 1};
  const int64_t rows = static_cast<int64_t>(nan_cols.size());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor logits = randn({rows, vp}, gen, DType::kF32, 0.0, 2.0);
    for (int64_t r = 0; r < rows; ++r)
      logits.data<float>()[r * vp + nan_cols[static_cast<size_t>(r)]] = std::nanf("");
    logits = logits.to(dt);
    const Tensor targets = Tensor::full({rows}, 5, DType::kI64);
    Tensor loss = poisoned_cuda({rows}, DType::kF32), lse = poisoned_cuda({rows}, DType::kF32);
    kernels::call_kernel<kernels::cross_entropy_forward_k>(
        logits.to(Device::cuda()), targets.to(Device::cuda()), -100, vp, loss, lse);
    Tensor want_loss = Tensor::empty({rows}, DType::kF32),
           want_lse = Tensor::empty({rows}, DType::kF32);
    kernels::call_kernel<kernels::cross_entropy_forward_k>(logits.to(DType::kF32), targets, -100,
                                                           vp, want_loss, want_lse);
    const std::vector<double> got = lse.to(Device::cpu()).to_vector(), want = want_lse.to_vector();
    const std::vector<double> got_loss = loss.to(Device::cpu()).to_vector();
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_TRUE(std::isnan(want[static_cast<size_t>(r)])) << "the CPU reference, row " << r;
      EXPECT_TRUE(std::isnan(got[static_cast<size_t>(r)]))
          << dtype_name(dt) << " lse, NaN at column " << nan_cols[static_cast<size_t>(r)];
      EXPECT_TRUE(std::isnan(got_loss[static_cast<size_t>(r)]))
          << dtype_name(dt) << " loss, NaN at column " << nan_cols[static_cast<size_t>(r)];
    }
  }
}

}  // namespace
}  // namespace loom
