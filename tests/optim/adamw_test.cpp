// tests/optim/adamw_test.cpp — AdamW against a hand-written double reference (bias correction,
// decoupled decay on decay=true parameters only), the fused kernel's thread-count
// determinism, the state_tensors save/restore contract, and the multi-tensor kernel (the same bits
// as one adamw_step per parameter; its bf16 copies, to nearest and stochastic), the step
// with a gradient factor read from a tensor (device clipping), a non-finite factor skipping the
// step uncounted (f16 overflow), and the step count's bias correction after set_step_count.
#include "optim/adamw.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "kernels/adamw.h"
#include "optim/sgd.h"

namespace loom {
namespace {

struct RefAdamW {  // torch.optim.AdamW, one parameter, in double
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd,
            int t) {
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
  }
}

void run_against_reference(DType dtype, double tol) {
  Generator gen(7);
  Tensor w = randn({5, 7}, gen, dtype).set_requires_grad(true);
  Tensor b = randn({7}, gen, dtype).set_requires_grad(true);
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  optim::AdamW opt({{"w", w, true}, {"b", b, false}}, b1, b2, eps, wd);
  RefAdamW rw{w.to_vector(), std::vector<double>(35), std::vector<double>(35)};
  RefAdamW rb{b.to_vector(), std::vector<double>(7), std::vector<double>(7)};
  const double lrs[] = {1e-2, 3e-2, 5e-3, 2e-2};
  for (int t = 1; t <= 4; ++t) {
    w.set_grad(randn(w.shape(), gen, dtype));
    b.set_grad(randn(b.shape(), gen, dtype));
    rw.step(w.grad().to_vector(), lrs[t - 1], b1, b2, eps, wd, t);
    rb.step(b.grad().to_vector(), lrs[t - 1], b1, b2, eps, 0.0, t);
    opt.step(lrs[t - 1]);
    expect_close(w.to_vector(), rw.p, tol);
    expect_close(b.to_vector(), rb.p, tol);
  }
  EXPECT_EQ(opt.step_count(), 4);
  expect_close(opt.state_tensors()[0].second.to_vector(), rw.m, tol);
  expect_close(opt.state_tensors()[1].second.to_vector(), rw.v, tol);
}

TEST(AdamW, MatchesReferenceF64) { run_against_reference(DType::kF64, 1e-12); }
TEST(AdamW, MatchesReferenceF32) { run_against_reference(DType::kF32, 2e-5); }

TEST(AdamW, DecayOnlyWhereAsked) {
  // Zero gradient: the Adam term is 0, so only the decoupled decay moves the parameter.
  Tensor w = Tensor::full({3, 3}, 2.0, DType::kF64), b = Tensor::full({3}, 2.0, DType::kF64);
  optim::AdamW opt({{"w", w, true}, {"b", b, false}}, 0.9, 0.999, 1e-8, 0.5);
  w.set_grad(Tensor::zeros_like(w));
  b.set_grad(Tensor::zeros_like(b));
  opt.step(0.1);
  for (double x : w.to_vector()) EXPECT_DOUBLE_EQ(x, 2.0 * (1 - 0.1 * 0.5));
  for (double x : b.to_vector()) EXPECT_DOUBLE_EQ(x, 2.0);
}

TEST(AdamW, ParametersWithoutGradientAreSkipped) {
  Tensor w = Tensor::ones({4}, DType::kF64), u = Tensor::ones({4}, DType::kF64);
  optim::AdamW opt({{"w", w, true}, {"u", u, true}}, 0.9, 0.999, 1e-8, 0.1);
  w.set_grad(Tensor::ones({4}, DType::kF64));
  opt.step(0.1);
  for (double x : u.to_vector()) EXPECT_EQ(x, 1.0);
  EXPECT_LT(w.to_vector()[0], 1.0);
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(AdamW, KernelSameBitsWithOneAndTwoThreads) {
  Generator gen(11);
  const Tensor p0 = randn({100003}, gen), g = randn({100003}, gen);
  const Tensor m0 = randn({100003}, gen), v0 = rand({100003}, gen);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<double>> results;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
    kernels::call_kernel<kernels::adamw_step_k>(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, int64_t{3});
    results.push_back(p.to_vector());
    auto mv = m.to_vector(), vv = v.to_vector();
    results.back().insert(results.back().end(), mv.begin(), mv.end());
    results.back().insert(results.back().end(), vv.begin(), vv.end());
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
}

// step_scaled(lr, g_s) is step(lr) after multiplying the gradients by g_s, bit for bit: on the
// multi-tensor path (one dtype: the factor read inside the update, .grad not written) and on the
// per-parameter path (mixed dtypes: the factor applied to the gradients first).
TEST(AdamW, ScaledStepIsTheStepOfScaledGradients) {
  for (const bool mixed : {false, true}) {
    Generator gen(21);
    const Tensor w0 = randn({37, 5}, gen), b0 = randn({5}, gen, mixed ? DType::kF64 : DType::kF32);
    const Tensor gw = randn(w0.shape(), gen), gb = randn(b0.shape(), gen, b0.dtype());
    Tensor w1 = w0.clone(), b1 = b0.clone(), w2 = w0.clone(), b2 = b0.clone();
    optim::AdamW by_hand({{"w", w1, true}, {"b", b1, false}}, 0.9, 0.95, 1e-8, 0.1);
    optim::AdamW scaled({{"w", w2, true}, {"b", b2, false}}, 0.9, 0.95, 1e-8, 0.1);
    for (const double factor : {0.3127, 0.9}) {
      w1.set_grad(ops::scale(gw, factor));  // scale_forward: dtype(factor) · g
      b1.set_grad(ops::scale(gb, factor));
      by_hand.step(1e-2);
      w2.set_grad(gw.clone());
      b2.set_grad(gb.clone());
      scaled.step_scaled(1e-2, Tensor::scalar(factor, DType::kF64));
      if (!mixed) {
        EXPECT_EQ(w2.grad().to_vector(), gw.to_vector()) << "the multi-tensor path wrote .grad";
      }
    }
    EXPECT_EQ(w2.to_vector(), w1.to_vector()) << (mixed ? "per-parameter" : "multi-tensor");
    EXPECT_EQ(b2.to_vector(), b1.to_vector()) << (mixed ? "per-parameter" : "multi-tensor");
    EXPECT_EQ(scaled.state_tensors()[1].second.to_vector(),
              by_hand.state_tensors()[1].second.to_vector());
    EXPECT_NE(w2.to_vector(), w0.to_vector());
  }
  // An unscaled step differs (the factor was applied; Adam is invariant to a constant factor up
  // to eps, so the factor changes between the steps).
  Generator gen(22);
  Tensor w = randn({9}, gen), v = w.clone();
  const Tensor g = randn({9}, gen);
  optim::AdamW a({{"w", w, false}}, 0.9, 0.95, 1e-8, 0.0),
      b({{"w", v, false}}, 0.9, 0.95, 1e-8, 0.0);
  for (int t = 0; t < 2; ++t) {
    w.set_grad(g.clone());
    v.set_grad(g.clone());
    a.step(1e-2);
    b.step_scaled(1e-2, Tensor::scalar(t == 0 ? 0.25 : 1.0, DType::kF64));
  }
  EXPECT_NE(w.to_vector(), v.to_vector());
}

// An f16 overflow's factor (NaN, or an infinite one) skips the step where it is applied: the
// parameters and moments keep their bits, the step count does not advance, and the next step is
// the one an optimizer that never saw the overflow takes (the same bias correction), on the
// multi-tensor path (the count read and advanced by the kernel) and the per-parameter one.
// SGD (the default step_scaled) skips too.
TEST(AdamW, NonFiniteFactorSkipsTheStepUncounted) {
  for (const bool mixed : {false, true}) {
    for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
      Generator gen(23);
      const Tensor w0 = randn({37, 5}, gen),
                   b0 = randn({5}, gen, mixed ? DType::kF64 : DType::kF32);
      Tensor w1 = w0.clone(), b1 = b0.clone(), w2 = w0.clone(), b2 = b0.clone();
      optim::AdamW plain({{"w", w1, true}, {"b", b1, false}}, 0.9, 0.95, 1e-8, 0.1);
      optim::AdamW skipping({{"w", w2, true}, {"b", b2, false}}, 0.9, 0.95, 1e-8, 0.1);
      const std::string what =
          std::string(mixed ? "per-parameter" : "multi-tensor") + " factor " + std::to_string(bad);
      for (int t = 0; t < 3; ++t) {
        const Tensor gw = randn(w0.shape(), gen), gb = randn(b0.shape(), gen, b0.dtype());
        w1.set_grad(gw.clone());
        b1.set_grad(gb.clone());
        plain.step_scaled(1e-2, Tensor::scalar(0.5, DType::kF64));
        w2.set_grad(gw.clone());
        b2.set_grad(gb.clone());
        skipping.step_scaled(1e-2, Tensor::scalar(0.5, DType::kF64));
        if (t == 0) {  // an overflowed step between the first and the second
          const std::vector<double> w_before = w2.to_vector(),
                                    m_before = skipping.state_tensors()[0].second.to_vector();
          w2.set_grad(randn(w0.shape(), gen));
          b2.set_grad(randn(b0.shape(), gen, b0.dtype()));
          skipping.step_scaled(1e-2, Tensor::scalar(bad, DType::kF64));
          EXPECT_EQ(w2.to_vector(), w_before) << what;
          EXPECT_EQ(skipping.state_tensors()[0].second.to_vector(), m_before) << what;
          EXPECT_EQ(skipping.step_count(), 1) << what;
        }
      }
      EXPECT_EQ(skipping.step_count(), 3) << what;
      EXPECT_EQ(w2.to_vector(), w1.to_vector()) << what;
      EXPECT_EQ(b2.to_vector(), b1.to_vector()) << what;
      for (size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(skipping.state_tensors()[k].second.to_vector(),
                  plain.state_tensors()[k].second.to_vector())
            << what;
      }
    }
  }
  Tensor w = Tensor::ones({3});
  optim::SGD sgd({{"w", w, false}}, 0.0, 0.0);
  w.set_grad(Tensor::ones({3}));
  sgd.step_scaled(0.1, Tensor::scalar(std::nan(""), DType::kF64));
  EXPECT_EQ(w.to_vector(), std::vector<double>(3, 1.0));
  EXPECT_EQ(sgd.step_count(), 0);
  sgd.step_scaled(0.1, Tensor::scalar(0.5, DType::kF64));
  for (const double x : w.to_vector()) EXPECT_NEAR(x, 1.0 - 0.1 * 0.5, 1e-7);
  EXPECT_EQ(sgd.step_count(), 1);
}

// The step count survives set_step_count (a resume) and feeds the bias correction: an
// optimizer set to count 4 takes the fifth step's update.
TEST(AdamW, SetStepCountSetsTheBiasCorrection) {
  Generator gen(24);
  const Tensor w0 = randn({11}, gen), g = randn({11}, gen);
  Tensor a = w0.clone(), b = w0.clone();
  optim::AdamW fifth({{"w", a, false}}, 0.9, 0.95, 1e-8, 0.0),
      first({{"w", b, false}}, 0.9, 0.95, 1e-8, 0.0);
  fifth.set_step_count(4);
  EXPECT_EQ(fifth.step_count(), 4);
  a.set_grad(g.clone());
  b.set_grad(g.clone());
  fifth.step(1e-2);
  first.step(1e-2);
  EXPECT_EQ(fifth.step_count(), 5);
  RefAdamW ref{w0.to_vector(), std::vector<double>(11), std::vector<double>(11)};
  ref.step(g.to_vector(), 1e-2, 0.9, 0.95, 1e-8, 0.0, 5);
  expect_close(a.to_vector(), ref.p, 1e-6);
  EXPECT_NE(a.to_vector(), b.to_vector());
  EXPECT_THROW(fifth.set_step_count(-1), Error);
}

TEST(AdamW, StateNamesAndValidation) {
  Tensor w = Tensor::zeros({2, 2});
  optim::AdamW opt({{"h.0.w", w, true}}, 0.9, 0.95, 1e-8, 0.1);
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].first, "exp_avg.h.0.w");
  EXPECT_EQ(st[1].first, "exp_avg_sq.h.0.w");
  EXPECT_EQ(st[0].second.shape(), w.shape());
  EXPECT_EQ(st[0].second.dtype(), DType::kF32);
  EXPECT_THROW(optim::AdamW({{"w", w, true}}, 1.0, 0.95, 1e-8, 0.1), Error);
  EXPECT_THROW(optim::AdamW({{"w", w, true}, {"w", w, true}}, 0.9, 0.95, 1e-8, 0.1), Error);
  EXPECT_THROW(opt.step(-1.0), Error);
}

TEST(AdamW, StateRoundTripGivesIdenticalNextStep) {
  Generator gen(5);
  Tensor w = randn({6, 5}, gen), b = randn({5}, gen);
  optim::AdamW a({{"w", w, true}, {"b", b, false}}, 0.9, 0.95, 1e-8, 0.1);
  for (int t = 0; t < 3; ++t) {
    w.set_grad(randn(w.shape(), gen));
    b.set_grad(randn(b.shape(), gen));
    a.step(1e-2);
  }
  // "Save": copy values out. "Load": a fresh optimiser over copies of the parameters, values
  // copied into its live state tensors, step count restored.
  std::vector<Tensor> saved;
  for (auto& [name, t] : a.state_tensors()) saved.push_back(t.clone());
  Tensor w2 = w.clone(), b2 = b.clone();
  optim::AdamW r({{"w", w2, true}, {"b", b2, false}}, 0.9, 0.95, 1e-8, 0.1);
  auto st = r.state_tensors();
  ASSERT_EQ(st.size(), saved.size());
  for (size_t i = 0; i < st.size(); ++i) ops::copy_(st[i].second, saved[i]);
  r.set_step_count(a.step_count());
  const Tensor gw = randn(w.shape(), gen), gb = randn(b.shape(), gen);
  w.set_grad(gw);
  b.set_grad(gb);
  w2.set_grad(gw.clone());
  b2.set_grad(gb.clone());
  a.step(7e-3);
  r.step(7e-3);
  EXPECT_EQ(w.to_vector(), w2.to_vector());
  EXPECT_EQ(b.to_vector(), b2.to_vector());
}

// Entries for adamw_multi_step over (p, g, m, v) quadruples, decay on every other one.
std::vector<kernels::AdamWParam> multi_entries(std::vector<std::array<Tensor, 4>>& s,
                                               const std::vector<Tensor>& copies) {
  std::vector<kernels::AdamWParam> list;
  for (size_t i = 0; i < s.size(); ++i) {
    list.push_back({s[i][0], s[i][1], s[i][2], s[i][3], i % 2 == 0 ? 0.1 : 0.0,
                    copies.empty() ? Tensor() : copies[i]});
  }
  return list;
}

std::vector<std::array<Tensor, 4>> random_quads(DType dt, Generator& gen) {
  std::vector<std::array<Tensor, 4>> s;
  for (int64_t n : {1, 3, 17, 65, 40003}) {
    s.push_back({randn({n}, gen, dt), randn({n}, gen, dt), randn({n}, gen, dt),
                 rand({n}, gen, dt, 0.01, 2.0)});
  }
  return s;
}

TEST(AdamW, MultiStepKernelGivesTheBitsOfPerParameterSteps) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    Generator gen(21);
    std::vector<std::array<Tensor, 4>> multi = random_quads(dt, gen), single;
    for (const auto& q : multi) single.push_back({q[0].clone(), q[1], q[2].clone(), q[3].clone()});
    for (int64_t step = 1; step <= 3; ++step) {
      kernels::AdamWOptions o;
      o.lr = 1e-2;
      o.beta1 = 0.9;
      o.beta2 = 0.95;
      o.eps = 1e-8;
      o.step = step;
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu)(multi_entries(multi, {}),
                                                                          o);
      for (size_t i = 0; i < single.size(); ++i) {
        kernels::call_kernel<kernels::adamw_step_k>(single[i][0], single[i][1], single[i][2],
                                                    single[i][3], o.lr, o.beta1, o.beta2, o.eps,
                                                    i % 2 == 0 ? 0.1 : 0.0, step);
      }
    }
    for (size_t i = 0; i < multi.size(); ++i) {
      for (int k : {0, 2, 3}) EXPECT_EQ(multi[i][k].to_vector(), single[i][k].to_vector()) << i;
    }
  }
}

TEST(AdamW, MultiStepBf16CopiesNearestAndStochastic) {
  Generator gen(22);
  std::vector<std::array<Tensor, 4>> s = random_quads(DType::kF32, gen);
  std::vector<Tensor> copies;
  for (const auto& q : s) copies.push_back(Tensor::empty(q[0].shape(), DType::kBF16));
  kernels::AdamWOptions o;
  o.lr = 1e-2;
  o.step = 2;
  auto* multi = kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu);
  multi(multi_entries(s, copies), o);
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(copies[i].to_vector(), s[i][0].to(DType::kBF16).to_vector()) << "nearest " << i;
  }
  // Stochastic: entry i, element j rounds with philox_bits(seed, offset + Σ_{k<i} ⌈n_k/4⌉, j).
  o.stochastic_rounding = true;
  o.seed = 99;
  o.offset = 5;
  multi(multi_entries(s, copies), o);
  uint64_t base = o.offset;
  for (size_t i = 0; i < s.size(); ++i) {
    const float* p = s[i][0].data<float>();
    const BFloat16* c = copies[i].data<BFloat16>();
    for (int64_t j = 0; j < s[i][0].numel(); ++j) {
      const uint32_t bits = std::bit_cast<uint32_t>(p[j]);
      ASSERT_EQ(c[j].bits, kernels::bf16_bits_stochastic(
                               bits, philox_bits(o.seed, base, static_cast<uint64_t>(j))))
          << "entry " << i << " element " << j;
      ASSERT_TRUE(c[j].bits == bits >> 16 || c[j].bits == (bits >> 16) + 1) << i << " " << j;
    }
    base += static_cast<uint64_t>((s[i][0].numel() + 3) / 4);
  }
}

TEST(AdamW, StochasticRoundingIsUnbiased) {
  // lr = 0 leaves the parameter as it is; 1 + ulp/4 (bf16's ulp at 1 is 2^-7) must round up a
  // quarter of the time, and values that bf16 holds exactly must never move.
  const int64_t n = 200000;
  Tensor p = Tensor::full({n}, 1.0 + 0.25 * std::ldexp(1.0, -7), DType::kF32);
  Tensor g = Tensor::ones({n}), m = Tensor::zeros({n}), v = Tensor::ones({n});
  Tensor copy = Tensor::empty({n}, DType::kBF16);
  Tensor q = Tensor::full({3}, -1.5, DType::kF32), gq = Tensor::ones({3});
  Tensor mq = Tensor::zeros({3}), vq = Tensor::ones({3}), copy_q = Tensor::empty({3}, DType::kBF16);
  kernels::AdamWOptions o;
  o.lr = 0.0;
  o.stochastic_rounding = true;
  o.seed = 3;
  kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu)(
      {{p, g, m, v, 0.0, copy}, {q, gq, mq, vq, 0.0, copy_q}}, o);
  int64_t up = 0;
  for (double x : copy.to_vector()) up += x > 1.0 ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(up) / static_cast<double>(n), 0.25, 0.01);
  for (double x : copy_q.to_vector()) EXPECT_EQ(x, -1.5);
}

}  // namespace
}  // namespace loom
