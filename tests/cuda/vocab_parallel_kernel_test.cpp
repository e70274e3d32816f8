// tests/cuda/vocab_parallel_kernel_test.cpp — the CUDA kernels of the vocab-parallel loss and
// embedding (kernels/cuda/cross_entropy.cu, kernels/cuda/embedding.cu) against the CPU kernels
// on fresh random inputs (the seed is printed on failure): vocab_parallel_ce_forward/backward for
// every logits dtype (the CPU reference runs bf16/f16 on the values upcast to f32), shards with
// and without padding columns, targets inside and outside the shard, ignored rows, odd and
// misaligned rows; vocab_parallel_lse_combine for f32/f64 statistics and 1–8 ranks;
// vocab_parallel_ids for every mask dtype. Outputs are poisoned first.
// Tolerances (relative error, NaN never passes): lse_local and target_logit 1e-5 (f32 math
// against the CPU's double; 1e-12 for f64); dlogits 1e-5 f32, 1e-12 f64, 1e-2 bf16/f16; the
// combine's lse/row_loss/loss 1e-12 (double math; exp/log may differ in the last bit) with lse
// and loss stored in f32 1e-6, inv_count exact; ids and mask exact. Padding columns and ignored
// rows keep their previous gradient bit for bit (the backward accumulates).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers

DType row_dtype(DType logits) { return logits == DType::kF64 ? DType::kF64 : DType::kF32; }

struct VpCase {
  int64_t rows, vl, start, valid;  // this rank: columns [start, start + vl), `valid` real
  int64_t vocab;                   // the global real vocabulary (targets lie below it)
  DType logits, targets;
  int64_t ignore_index;
  bool misalign;
};

std::string label(const VpCase& c) {
  return std::string(dtype_name(c.logits)) + " rows " + std::to_string(c.rows) + " vl " +
         std::to_string(c.vl) + " start " + std::to_string(c.start) + " valid " +
         std::to_string(c.valid) + " targets " + dtype_name(c.targets) +
         (c.misalign ? " misaligned" : "");
}

// Global targets: about half inside this rank's real columns, a quarter elsewhere in the
// vocabulary, a quarter ignored (row 0 always counts); `ignored` lists the ignored rows.
Tensor make_targets(const VpCase& c, std::mt19937_64& rng, std::vector<int64_t>& ignored) {
  std::vector<int64_t> v(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    const uint64_t coin = rng() % 4;
    int64_t t = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab));
    if (coin < 2) t = c.start + static_cast<int64_t>(rng() % static_cast<uint64_t>(c.valid));
    if (coin == 3 && r != 0) {
      t = c.ignore_index;
      ignored.push_back(r);
    }
    v[static_cast<size_t>(r)] = t;
  }
  return Tensor::from_vector<int64_t>(v, {c.rows}).to(c.targets);
}

class CudaVocabParallelTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    seed_ = fresh_seed();
  }
  uint64_t seed_ = 0;
};

void check_case(const VpCase& c, Generator& gen, std::mt19937_64& rng) {
  const std::string what = label(c);
  const DType rowd = row_dtype(c.logits);
  std::vector<int64_t> ignored;
  const Tensor logits = randn({c.rows, c.vl}, gen, c.logits, 0.0, 3.0);
  const Tensor targets = make_targets(c, rng, ignored);
  const Tensor ref_logits = to_ref(logits);
  const Tensor g_logits = to_gpu(logits, c.misalign), g_targets = targets.to(Device::cuda());

  // Forward.
  Tensor want_lse = Tensor::empty({c.rows}, rowd), want_tl = Tensor::empty({c.rows}, rowd);
  kernels::call_kernel<kernels::vocab_parallel_ce_forward_k>(ref_logits, targets, c.ignore_index,
                                                             c.start, c.valid, want_lse, want_tl);
  Tensor got_lse = poisoned_cuda({c.rows}, rowd), got_tl = poisoned_cuda({c.rows}, rowd);
  kernels::call_kernel<kernels::vocab_parallel_ce_forward_k>(g_logits, g_targets, c.ignore_index,
                                                             c.start, c.valid, got_lse, got_tl);
  const double row_tol = c.logits == DType::kF64 ? 1e-12 : 1e-5;
  EXPECT_LT(rel_error(want_lse, got_lse), row_tol) << "lse_local " << what;
  // The target logit is a copy of one stored logit: exact.
  expect_same_bits(want_tl, got_tl, "target_logit " + what);
  const Tensor host_lse = got_lse.to(Device::cpu());
  for (int64_t r : ignored) EXPECT_EQ(host_lse.at({r}), 0.0) << "ignored row " << r << " " << what;

  // Backward, accumulating into small random gradients; the global lse is stood in for by
  // this rank's (any value works for the kernel contract).
  const double dloss = 0.75, grad_scale = 1.0 / static_cast<double>(c.rows);
  const Tensor d0 = randn({c.rows, c.vl}, gen, c.logits, 0.0, 1e-2 * grad_scale);
  Tensor want_d = to_ref(d0);
  kernels::call_kernel<kernels::vocab_parallel_ce_backward_k>(
      ref_logits, targets, want_lse, Tensor::scalar(dloss, rowd), grad_scale, c.ignore_index,
      c.start, c.valid, want_d);
  Tensor got_d = to_gpu(d0, c.misalign);
  kernels::call_kernel<kernels::vocab_parallel_ce_backward_k>(
      g_logits, g_targets, got_lse, Tensor::scalar(dloss, rowd, Device::cuda()), grad_scale,
      c.ignore_index, c.start, c.valid, got_d);
  EXPECT_LT(rel_error(want_d, got_d), tol(c.logits)) << "dlogits " << what;
  if (c.valid < c.vl) {
    expect_same_bits(d0.narrow(1, c.valid, c.vl - c.valid),
                     got_d.narrow(1, c.valid, c.vl - c.valid), "padding columns " + what);
  }
  for (int64_t r : ignored) {
    expect_same_bits(d0.narrow(0, r, 1), got_d.narrow(0, r, 1),
                     "ignored row " + std::to_string(r) + " " + what);
  }
}

TEST_F(CudaVocabParallelTest, CeForwardBackwardMatchCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  std::mt19937_64 rng(seed_);
  const std::vector<VpCase> cases = {
      // GPT-2 over tp 4: ranks 0 and 3 (the last holds the padding).
      {37, 12576, 0, 12576, 50257, DType::kF32, DType::kI64, -100, false},
      {37, 12576, 37728, 12529, 50257, DType::kBF16, DType::kI32, -100, false},
      {5, 16032, 112224, 16032, 128256, DType::kBF16, DType::kI64, -100, false},  // Llama 3, tp 8
      {9, 1003, 1003, 997, 2000, DType::kF16, DType::kU16, 65535, false},
      {64, 1001, 2002, 1001, 5000, DType::kF32, DType::kU32, 7, true},
      {17, 17, 34, 13, 47, DType::kBF16, DType::kI64, -100, true},
      {7, 65, 65, 60, 125, DType::kF64, DType::kI64, -100, false},
      {3, 1, 2, 1, 3, DType::kF32, DType::kI64, -100, false},  // one-column shards
  };
  for (const VpCase& c : cases) check_case(c, gen, rng);
}

TEST_F(CudaVocabParallelTest, LseCombineMatchesCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  Generator gen(seed_);
  std::mt19937_64 rng(seed_);
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int64_t g : {1, 2, 3, 8}) {
      for (int64_t n : {1, 37, 1029}) {
        const int64_t vocab = 50257, ignore = -100;
        const std::string what =
            std::string(dtype_name(dt)) + " g " + std::to_string(g) + " n " + std::to_string(n);
        std::vector<int64_t> t(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) {
          const bool ig = r > 0 && rng() % 4 == 0;
          t[static_cast<size_t>(r)] =
              ig ? ignore : static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
        }
        const Tensor targets = Tensor::from_vector(t, {n}).to(DType::kI32);
        const Tensor lses = randn({g, n}, gen, dt, 8.0, 4.0), tl = randn({n}, gen, dt, 0.0, 3.0);
        Tensor w_lse = Tensor::empty({n}, dt), w_rl = Tensor::empty({n}, DType::kF64);
        Tensor w_loss = Tensor::empty({}, dt), w_inv = Tensor::empty({}, DType::kF64);
        kernels::call_kernel<kernels::vocab_parallel_lse_combine_k>(
            lses, tl, targets, ignore, vocab, w_lse, w_rl, w_loss, w_inv);
        Tensor g_lse = poisoned_cuda({n}, dt), g_rl = poisoned_cuda({n}, DType::kF64);
        Tensor g_loss = poisoned_cuda({}, dt), g_inv = poisoned_cuda({}, DType::kF64);
        kernels::call_kernel<kernels::vocab_parallel_lse_combine_k>(
            lses.to(Device::cuda()), tl.to(Device::cuda()), targets.to(Device::cuda()), ignore,
            vocab, g_lse, g_rl, g_loss, g_inv);
        const double stored_tol = dt == DType::kF64 ? 1e-12 : 1e-6;
        EXPECT_LT(rel_error(w_lse, g_lse), stored_tol) << "lse " << what;
        EXPECT_LT(rel_error(w_rl, g_rl), 1e-12) << "row_loss " << what;
        EXPECT_LT(rel_error(w_loss, g_loss), stored_tol) << "loss " << what;
        expect_same_bits(w_inv, g_inv, "inv_count " + what);
        const Tensor h_lse = g_lse.to(Device::cpu()), h_rl = g_rl.to(Device::cpu());
        for (int64_t r = 0; r < n; ++r) {
          if (t[static_cast<size_t>(r)] != ignore) continue;
          EXPECT_EQ(h_lse.at({r}), 0.0) << "ignored row " << r << " " << what;
          EXPECT_EQ(h_rl.at({r}), 0.0) << "ignored row " << r << " " << what;
        }
      }
    }
  }
}

TEST_F(CudaVocabParallelTest, LseCombineWithNoCountedRowAndBadTarget) {
  Generator gen(fresh_seed());
  const int64_t n = 4;
  const Tensor lses = randn({2, n}, gen, DType::kF32).to(Device::cuda());
  const Tensor tl = randn({n}, gen, DType::kF32).to(Device::cuda());
  Tensor lse = poisoned_cuda({n}, DType::kF32), rl = poisoned_cuda({n}, DType::kF64);
  Tensor loss = poisoned_cuda({}, DType::kF32), inv = poisoned_cuda({}, DType::kF64);
  kernels::call_kernel<kernels::vocab_parallel_lse_combine_k>(
      lses, tl, Tensor::full({n}, -100, DType::kI64, Device::cuda()), -100, 10, lse, rl, loss, inv);
  expect_same_bits(Tensor::zeros({}), loss, "loss");
  expect_same_bits(Tensor::zeros({}, DType::kF64), inv, "inv_count");
  expect_same_bits(Tensor::zeros({n}), lse, "lse");
  // A target outside [0, vocab) cannot raise on the device: its row, and the loss, are NaN.
  const Tensor bad = Tensor::from_vector<int64_t>({1, 10, -100, 3}, {n}).to(Device::cuda());
  kernels::call_kernel<kernels::vocab_parallel_lse_combine_k>(lses, tl, bad, -100, 10, lse, rl,
                                                              loss, inv);
  EXPECT_TRUE(std::isnan(rl.to(Device::cpu()).at({1})));
  EXPECT_TRUE(std::isnan(loss.to(Device::cpu()).item()));
  EXPECT_EQ(inv.to(Device::cpu()).item(), 1.0 / 3.0);
}

TEST_F(CudaVocabParallelTest, IdsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 12565, start = 2 * rows;
  for (int64_t n : {1, 17, 1000003}) {
    for (DType idt : {DType::kI32, DType::kI64, DType::kU32}) {
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (auto& id : ids) id = static_cast<int64_t>(rng() % (4 * rows));
      const Tensor h_ids = Tensor::from_vector(ids, {n}).to(idt);
      Tensor w_local = Tensor::empty({n}, DType::kI64), w_mask = Tensor::empty({n, 1});
      kernels::call_kernel<kernels::vocab_parallel_ids_k>(h_ids, start, rows, w_local, w_mask);
      for (DType mdt : kFloatDTypes) {
        const std::string what =
            std::string(dtype_name(idt)) + " mask " + dtype_name(mdt) + " n " + std::to_string(n);
        Tensor g_local = poisoned_cuda({n}, DType::kI64), g_mask = poisoned_cuda({n, 1}, mdt);
        kernels::call_kernel<kernels::vocab_parallel_ids_k>(h_ids.to(Device::cuda()), start, rows,
                                                            g_local, g_mask);
        expect_same_bits(w_local, g_local, "local ids " + what);
        expect_same_bits(w_mask.to(mdt), g_mask, "mask " + what);  // 0 and 1 are exact
      }
    }
  }
}

}  // namespace
}  // namespace loom
