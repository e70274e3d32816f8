// tests/core/ops/attention_test.cpp — causal_attention (multi-head and grouped-query): values
// against an explicit T×T masked-softmax loop, strided inputs, and identical bits for 1, 2 and 3
// threads; the cuDNN attention guard. Gradients at these shapes (finite differences in f64, f32
// against f64, other backends) are the conformance table's attention cases
// (tests/conformance/cases/attention.cpp).
#include "core/ops/attention.h"

#include <omp.h>

#include <cmath>

#include "core/ops/view.h"
#include "kernels/attention.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::random;

// Explicit reference: the full T×T score matrix per head, causal mask, softmax, then P·V.
// q (B,Hq,T,D), k, v (B,Hkv,T,D) → (B,Hq,T,D) in logical order.
std::vector<double> attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                        double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1);
  std::vector<double> out;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv);
      std::vector<std::vector<double>> p(T, std::vector<double>(T, 0.0));
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q.at({b, h, i, d}) * k.at({b, kvh, j, d});
          p[i][j] = s * scale;
          m = std::max(m, p[i][j]);
        }
        for (int64_t j = 0; j <= i; ++j) l += (p[i][j] = std::exp(p[i][j] - m));
        for (int64_t j = 0; j <= i; ++j) p[i][j] /= l;
      }
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < T; ++j) o += p[i][j] * v.at({b, kvh, j, d});
          out.push_back(o);
        }
      }
    }
  }
  return out;
}

struct AttnCase {
  int64_t b, hq, hkv, t, d;
  double scale;  // <= 0: the default 1/sqrt(D)
};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, ValuesMatchReference) {
  Generator gen(21);
  const AttnCase c = GetParam();
  Tensor q = random({c.b, c.hq, c.t, c.d}, gen, DType::kF64, false);
  Tensor k = random({c.b, c.hkv, c.t, c.d}, gen, DType::kF64, false);
  Tensor v = random({c.b, c.hkv, c.t, c.d}, gen, DType::kF64, false);
  const double ref_scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  EXPECT_LT(testing::rel_error(ops::causal_attention(q, k, v, c.scale).to_vector(),
                               attention_reference(q, k, v, ref_scale)),
            1e-13);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnCase{1, 1, 1, 1, 3, 0.0},    // one token
                                           AttnCase{2, 2, 2, 3, 8, 0.0},    // MHA
                                           AttnCase{1, 2, 2, 17, 3, 0.7},   // MHA, odd D
                                           AttnCase{1, 4, 2, 17, 3, 0.0},   // GQA, odd D
                                           AttnCase{2, 4, 2, 17, 8, 0.0},   // GQA
                                           AttnCase{2, 3, 1, 5, 4, 0.0}));  // MQA

// The layer hands attention (B, T, H, D) views transposed to (B, H, T, D): the same bits as
// contiguous copies (their gradients: the table's attention__strided_BTHD_views case).
TEST(Attention, StridedInputs) {
  Generator gen(22);
  Tensor q = random({2, 5, 4, 6}, gen), k = random({2, 5, 2, 6}, gen),
         v = random({2, 5, 2, 6}, gen);
  auto fn = [](const std::vector<Tensor>& in) {
    return ops::causal_attention(ops::transpose(in[0], 1, 2), ops::transpose(in[1], 1, 2),
                                 ops::transpose(in[2], 1, 2));
  };
  Tensor qt = ops::contiguous(ops::transpose(q, 1, 2)),
         kt = ops::contiguous(ops::transpose(k, 1, 2)),
         vt = ops::contiguous(ops::transpose(v, 1, 2));
  EXPECT_EQ(fn({q, k, v}).to_vector(), ops::causal_attention(qt, kt, vt).to_vector());
}

TEST(Attention, SameBitsForAnyThreadCount) {
  Generator gen(23);
  Tensor q = random({2, 4, 64, 16}, gen, DType::kF32);
  Tensor k = random({2, 2, 64, 16}, gen, DType::kF32);
  Tensor v = random({2, 2, 64, 16}, gen, DType::kF32);
  Tensor w = random({2, 4, 64, 16}, gen, DType::kF32, false);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<double>> ref;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (Tensor* t : {&q, &k, &v}) t->zero_grad();
    Tensor out = ops::causal_attention(q, k, v);
    autograd::backward(testing::weighted_sum(out, w));
    std::vector<std::vector<double>> got{out.to_vector(), q.grad().to_vector(),
                                         k.grad().to_vector(), v.grad().to_vector()};
    if (ref.empty()) {
      ref = got;
    } else {
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i], ref[i]) << threads << " threads, item " << i;
    }
  }
  omp_set_num_threads(saved);
}

TEST(Attention, RejectsMismatchedHeads) {
  Tensor q = Tensor::zeros({1, 3, 4, 8}), kv = Tensor::zeros({1, 2, 4, 8});
  try {
    ops::causal_attention(q, kv, kv);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of kv heads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::causal_attention(q, Tensor::zeros({1, 3, 5, 8}), Tensor::zeros({1, 3, 5, 8})),
               Error);
}

// Note [cuDNN attention]: the choice is scoped and off by default; what cuDNN takes does not
// depend on it, and nothing is taken by a build without the cuDNN path.
TEST(CudnnAttentionGuard, ScopedAndOffByDefault) {
  EXPECT_FALSE(kernels::cudnn_attention_requested());
  {
    kernels::CudnnAttentionGuard on;
    EXPECT_TRUE(kernels::cudnn_attention_requested());
    {
      kernels::CudnnAttentionGuard off(false);
      EXPECT_FALSE(kernels::cudnn_attention_requested());
    }
    EXPECT_TRUE(kernels::cudnn_attention_requested());
  }
  EXPECT_FALSE(kernels::cudnn_attention_requested());
  const bool built = kernels::cudnn_attention_built();
  EXPECT_EQ(kernels::cudnn_attention_handles(DType::kBF16, 1024, 64), built);
  EXPECT_EQ(kernels::cudnn_attention_handles(DType::kF16, 2, 128), built);
  EXPECT_EQ(kernels::cudnn_attention_handles(DType::kBF16, 17, 40), built);
  EXPECT_FALSE(kernels::cudnn_attention_handles(DType::kF32, 1024, 64));
  EXPECT_FALSE(kernels::cudnn_attention_handles(DType::kBF16, 1, 64));  // cuDNN refuses T = 1
  EXPECT_FALSE(kernels::cudnn_attention_handles(DType::kBF16, 1024, 24 + 2));
  EXPECT_FALSE(kernels::cudnn_attention_handles(DType::kF16, 1024, 136));
}

}  // namespace
}  // namespace loom
