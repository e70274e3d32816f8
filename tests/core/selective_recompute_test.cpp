// tests/core/selective_recompute_test.cpp — Note [Selective recompute] in core/checkpoint.h: a
// selective region gives the gradients a plain one gives, holds its inputs and exactly the kept
// ops' results between forward and backward, computes a kept op once and the others twice,
// replays its randomness, refuses a recomputation that calls other kept ops, and parses its list.
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/view.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

// x (N, C) → linear(w1, b1) → gelu → matmul(w2) → as (1, 2, T, C/2) heads → causal_attention
// → back to (N, C) · x. Two matmul ops (linear, matmul), one attention; the rest is recomputed.
struct Region {
  Tensor w1, b1, w2;
  int64_t T;
  std::vector<Tensor> operator()(const std::vector<Tensor>& in) const {
    const Tensor h = ops::gelu(ops::linear(in[0], w1, b1));
    const Tensor m = ops::matmul(h, w2);
    const int64_t C = m.size(1);
    const Tensor heads = ops::transpose(ops::reshape(m, {1, T, 2, C / 2}), 1, 2);
    const Tensor a = ops::causal_attention(heads, heads, heads);
    const Tensor back = ops::reshape(ops::transpose(a, 1, 2), {T, C});
    return {ops::mul(back, in[0])};
  }
};

struct Outcome {
  std::vector<std::vector<double>> grads;
  int64_t held = 0;  // bytes alive between the forward and the backward
};

// recompute: 0 none, 1 full, 2 selective keeping `keep`.
Outcome run_region(const Region& region, const Tensor& x0, int recompute, KeptOps keep) {
  for (Tensor t : {region.w1, region.b1, region.w2, x0}) t.zero_grad();
  Allocator& alloc = allocator_for(DeviceType::kCpu);
  const int64_t base = alloc.stats().current_bytes;
  Outcome r;
  {
    const Tensor x = ops::scale(x0, 1.5);  // an input with history
    auto fn = [&](const std::vector<Tensor>& in) { return region(in); };
    const Tensor y =
        recompute == 0 ? fn({x})[0] : checkpoint(fn, {x}, {}, recompute == 2 ? keep : 0)[0];
    const Tensor loss = ops::sum(ops::mul(y, y));
    r.held = alloc.stats().current_bytes - base;
    autograd::backward(loss);
  }
  for (const Tensor& t : {region.w1, region.b1, region.w2, x0})
    r.grads.push_back(t.grad().to_vector());
  return r;
}

TEST(SelectiveRecompute, SameGradientsAndHoldsExactlyTheKeptResults) {
  Generator gen(3);
  const int64_t T = 24, C = 8, F = 16;
  const Region region{random({F, C}, gen, DType::kF64, true, 0.3),
                      random({F}, gen, DType::kF64, true, 0.1),
                      random({F, C}, gen, DType::kF64, true, 0.3), T};
  const Tensor x0 = random({T, C}, gen, DType::kF64, true);
  const Outcome plain = run_region(region, x0, 0, 0), full = run_region(region, x0, 1, 0);
  // The kept results, in f64 bytes: the linear's (T, F) and the matmul's (T, C); the
  // attention's output (1, 2, T, C/2) and its lse (1, 2, T).
  const int64_t e = 8, matmul_bytes = (T * F + T * C) * e, attention_bytes = (T * C + 2 * T) * e;
  const KeptOps both = kept_bit(KeptOp::kMatmul) | kept_bit(KeptOp::kAttention);
  for (KeptOps keep : {kept_bit(KeptOp::kMatmul), kept_bit(KeptOp::kAttention), both}) {
    SCOPED_TRACE(kept_ops_text(keep));
    const Outcome sel = run_region(region, x0, 2, keep);
    ASSERT_EQ(sel.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(sel.grads[i], plain.grads[i]) << i;
    const int64_t kept = (keep & kept_bit(KeptOp::kMatmul) ? matmul_bytes : 0) +
                         (keep & kept_bit(KeptOp::kAttention) ? attention_bytes : 0);
    EXPECT_EQ(sel.held, full.held + kept);
    EXPECT_LT(sel.held, plain.held);
  }
}

TEST(SelectiveRecompute, KeptOpsRunOnceTheOthersTwice) {
  int matmuls = 0, attentions = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor a = kept_or_computed(KeptOp::kMatmul, [&] {
      ++matmuls;
      return std::vector<Tensor>{ops::scale(in[0].detach(), 2.0)};
    })[0];
    Tensor b = kept_or_computed(KeptOp::kAttention, [&] {
      ++attentions;
      return std::vector<Tensor>{ops::scale(in[0].detach(), 3.0)};
    })[0];
    return std::vector<Tensor>{ops::mul(ops::add(a, b), in[0])};
  };
  Generator gen(4);
  const Tensor x = random({5}, gen, DType::kF64, true);
  const Tensor y = checkpoint(fn, {x}, {}, kept_bit(KeptOp::kMatmul))[0];
  EXPECT_EQ(matmuls, 1);
  EXPECT_EQ(attentions, 1);
  autograd::backward(ops::sum(y));
  EXPECT_EQ(matmuls, 1);     // kept: its forward's result reused
  EXPECT_EQ(attentions, 2);  // not kept: recomputed
  // Outside a region nothing is kept.
  fn({x});
  EXPECT_EQ(matmuls, 2);
}

TEST(SelectiveRecompute, RandomnessIsReplayed) {
  Generator gen(5), noise(11);
  Tensor w = random({6, 6}, gen);
  Tensor x = random({4, 6}, gen, DType::kF64, true);
  auto fn = [&](const std::vector<Tensor>& in) {
    const Tensor m = randn({4, 6}, noise, DType::kF64);
    return std::vector<Tensor>{ops::mul(ops::gelu(ops::matmul(in[0], w)), m)};
  };
  const GeneratorState start = noise.state();
  const Tensor y = checkpoint(fn, {x}, {&noise}, kept_bit(KeptOp::kMatmul))[0];
  autograd::backward(ops::sum(ops::mul(y, y)));
  const std::vector<double> gw = w.grad().to_vector(), gx = x.grad().to_vector();
  w.zero_grad();
  x.zero_grad();
  noise.set_state(start);
  const Tensor y2 = fn({x})[0];
  autograd::backward(ops::sum(ops::mul(y2, y2)));
  EXPECT_EQ(gw, w.grad().to_vector());
  EXPECT_EQ(gx, x.grad().to_vector());
}

TEST(SelectiveRecompute, ARecomputationThatDiffersIsRefused) {
  Generator gen(6);
  const Tensor w = random({4, 4}, gen);
  const Tensor x = random({4, 4}, gen, DType::kF64, true);
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {  // one matmul more when recomputed
    Tensor y = ops::matmul(in[0], w);
    if (++calls > 1) y = ops::matmul(y, w);
    return std::vector<Tensor>{y};
  };
  const Tensor y = checkpoint(fn, {x}, {}, kept_bit(KeptOp::kMatmul))[0];
  try {
    autograd::backward(ops::sum(y));
    FAIL() << "expected the recomputation to be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more matmul ops than the region's forward"),
              std::string::npos)
        << e.what();
  }
}

TEST(SelectiveRecompute, ParsesItsList) {
  const KeptOps both = kept_bit(KeptOp::kMatmul) | kept_bit(KeptOp::kAttention);
  EXPECT_EQ(parse_kept_ops("matmul,attention", "k"), both);
  EXPECT_EQ(parse_kept_ops(" attention , matmul ", "k"), both);
  EXPECT_EQ(parse_kept_ops("attention", "k"), kept_bit(KeptOp::kAttention));
  EXPECT_EQ(kept_ops_text(both), "matmul,attention");
  auto message = [](const std::string& text) {
    try {
      parse_kept_ops(text, "model.recompute_save");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("matmul,softmax"),
            "model.recompute_save: unknown op 'softmax' in 'matmul,softmax' (a comma-separated "
            "list of matmul, attention)");
  EXPECT_EQ(message("matmul,matmul"),
            "model.recompute_save: 'matmul' is listed twice in 'matmul,matmul'");
  EXPECT_NE(message("").find("names no op"), std::string::npos);
}

}  // namespace
}  // namespace loom
