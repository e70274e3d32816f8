// tests/layers/precision_test.cpp — the mixed-precision plumbing (Note [Compute dtype] in
// layers/module.h) on the CPU, with f64 as the compute dtype the CPU kernels support: the
// activations come out in the compute dtype, gradients arrive on the f32 masters in f32, and
// loss and gradients match the plain f32 model's to f32 rounding (relative 1e-5 for the loss,
// 1e-4 per gradient tensor, the f32 run being the less accurate of the two). Also: the setting
// propagates to children registered later, and unset it changes nothing.
#include <gtest/gtest.h>

#include <cmath>

#include "layers/linear.h"
#include "tiny_models.h"

namespace loom {
namespace {

using testing::perturb_parameters;
using testing::random_ids;

double rel_error(const Tensor& want, const Tensor& got) {
  const std::vector<double> a = want.to_vector(), b = got.to_vector();
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(b[i])) return INFINITY;
    num += (b[i] - a[i]) * (b[i] - a[i]);
    den += a[i] * a[i];
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

struct ModelRun {
  Tensor logits, loss;
  std::vector<std::pair<std::string, Tensor>> params;
};

// A model with the seed's weights (perturbed, so norms and biases matter), computing in
// `compute` (nullopt: its own dtype); one forward and backward on fixed tokens.
ModelRun run_model(const ModelConfig& mc, DType master, std::optional<DType> compute) {
  ModelRun r;
  auto model = std::make_unique<Transformer>(mc, master);
  Generator gen(77);
  model->init_weights(gen);
  perturb_parameters(*model, 0.05, 78);
  model->set_compute_dtype(compute);
  const Tensor ids = random_ids(3, 7, mc.vocab_size, 79);
  const Tensor targets = random_ids(3, 7, mc.vocab_size, 80);
  r.logits = model->forward(ids).detach();
  r.loss = model->loss(ids, targets);
  autograd::backward(r.loss);
  r.params = model->named_parameters();
  return r;
}

void expect_plumbing(const ModelConfig& mc) {
  const ModelRun plain = run_model(mc, DType::kF32, std::nullopt);
  const ModelRun mixed = run_model(mc, DType::kF32, DType::kF64);
  EXPECT_EQ(plain.logits.dtype(), DType::kF32);
  EXPECT_EQ(mixed.logits.dtype(), DType::kF64) << "activations must be in the compute dtype";
  EXPECT_EQ(mixed.loss.dtype(), DType::kF64);
  EXPECT_LT(rel_error(plain.logits, mixed.logits), 1e-5);
  EXPECT_LT(std::abs(mixed.loss.item() - plain.loss.item()), 1e-5 * std::abs(mixed.loss.item()));
  ASSERT_EQ(plain.params.size(), mixed.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    const auto& [name, p] = mixed.params[i];
    EXPECT_EQ(p.dtype(), DType::kF32) << name << ": masters stay f32";
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::kF32)
        << name << ": the gradient arrives in the master's dtype";
    EXPECT_LT(rel_error(plain.params[i].second.grad(), p.grad()), 1e-4) << name;
  }
}

TEST(Precision, Gpt2ComputesInTheComputeDtypeWithF32Masters) {
  expect_plumbing(testing::tiny_gpt2());
}

TEST(Precision, LlamaComputesInTheComputeDtypeWithF32Masters) {
  expect_plumbing(testing::tiny_llama());
}

TEST(Precision, ActivationCheckpointingKeepsThePlumbing) {
  ModelConfig mc = testing::tiny_gpt2();
  mc.recompute = "full";
  expect_plumbing(mc);
}

TEST(Precision, UnsetOrEqualComputeDtypeChangesNothing) {
  const ModelRun plain = run_model(testing::tiny_gpt2(), DType::kF32, std::nullopt);
  const ModelRun same = run_model(testing::tiny_gpt2(), DType::kF32, DType::kF32);
  EXPECT_EQ(plain.loss.item(), same.loss.item());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_EQ(plain.params[i].second.grad().to_vector(), same.params[i].second.grad().to_vector())
        << plain.params[i].first;
  }
}

TEST(Precision, SettingPropagatesToChildrenRegisteredLater) {
  struct Outer : Module {
    Linear a{3, 2, true}, b{2, 5, false};
    Outer() { register_module("a", a); }
    void add_b() { register_module("b", b); }
  } m;
  m.set_compute_dtype(DType::kF64);
  m.add_b();
  EXPECT_EQ(m.a.compute_dtype(), DType::kF64);
  EXPECT_EQ(m.b.compute_dtype(), DType::kF64);
  Generator gen(3);
  const Tensor x = randn({4, 3}, gen, DType::kF64);
  EXPECT_EQ(m.b.forward(m.a.forward(x)).dtype(), DType::kF64);
  m.set_compute_dtype(std::nullopt);
  EXPECT_FALSE(m.b.compute_dtype().has_value());
  EXPECT_THROW(m.set_compute_dtype(DType::kI32), Error);
}

}  // namespace
}  // namespace loom
