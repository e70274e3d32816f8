// tests/kernels/packed_attention_kernel_test.cpp — causal attention over packed documents
// (doc_start, Note [Packed documents] in kernels/attention.h) on the CPU: a packed row of
// documents of different lengths gives the out, lse and dq, dk, dv (from the same dout) of plain
// causal attention run on each document alone (f64 to 1e-12, f32 to 1e-6; multi-head and
// grouped-query); an all-zero doc_start is the plain kernel bit for bit; results do not depend
// on the thread count; a sliding window's first keys give the softmax written out over the
// window; ops::causal_attention with doc_start (documents, a window) passes the f64
// finite-difference gradcheck, saves doc_start for backward, and rejects a malformed doc_start
// with a message.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/attention.h"
#include "core/ops/view.h"
#include "kernels/attention.h"
#include "tests/gradcheck.h"

namespace loom {
namespace {

using testing::rel_error;

// doc_start (T) i32 of documents of these lengths, in order.
Tensor doc_start_of(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> ds;
  for (int64_t n : lengths) {
    const auto start = static_cast<int32_t>(ds.size());
    for (int64_t i = 0; i < n; ++i) ds.push_back(start);
  }
  return Tensor::from_vector(ds, {static_cast<int64_t>(ds.size())});
}

struct Fwd {
  Tensor out, lse;
};
struct Grads {
  Tensor dq, dk, dv;
};

Fwd forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_start,
            double scale) {
  Fwd f{Tensor::full(q.shape(), NAN, q.dtype()),
        Tensor::full({q.size(0), q.size(1), q.size(2)}, NAN, q.dtype())};
  kernels::call_kernel<kernels::attention_forward_k>(q, k, v, doc_start, scale, f.out, f.lse);
  return f;
}

// Gradients accumulated into zeros.
Grads backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_start,
               const Fwd& f, const Tensor& dout, double scale) {
  Grads g{Tensor::zeros_like(q), Tensor::zeros_like(k), Tensor::zeros_like(v)};
  kernels::call_kernel<kernels::attention_backward_k>(q, k, v, doc_start, f.out, f.lse, dout, scale,
                                                      g.dq, g.dk, g.dv);
  return g;
}

// Positions [a, a + n) of the sequence dimension (2) as a contiguous tensor.
Tensor slice(const Tensor& x, int64_t a, int64_t n) { return x.narrow(2, a, n).contiguous(); }

struct Case {
  DType dtype;
  int64_t hq, hkv;
  std::vector<int64_t> docs;
};

void check_packed_equals_per_document(const Case& c, double tol, uint64_t seed) {
  const int64_t B = 2, D = 5;
  int64_t T = 0;
  for (int64_t n : c.docs) T += n;
  SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " Hq=" + std::to_string(c.hq) +
               " Hkv=" + std::to_string(c.hkv) + " T=" + std::to_string(T));
  Generator gen(seed);
  const Tensor q = randn({B, c.hq, T, D}, gen, c.dtype), k = randn({B, c.hkv, T, D}, gen, c.dtype),
               v = randn({B, c.hkv, T, D}, gen, c.dtype),
               dout = randn({B, c.hq, T, D}, gen, c.dtype);
  const double scale = 0.45;
  const Tensor ds = doc_start_of(c.docs);
  const Fwd packed = forward(q, k, v, ds, scale);
  const Grads gp = backward(q, k, v, ds, packed, dout, scale);
  const Fwd plain = forward(q, k, v, Tensor(), scale);  // crosses documents: must differ
  EXPECT_GT(rel_error(packed.out, plain.out), 1e-3) << "doc_start had no effect";
  int64_t a = 0;
  for (int64_t n : c.docs) {
    SCOPED_TRACE("document [" + std::to_string(a) + ", " + std::to_string(a + n) + ")");
    const Tensor qd = slice(q, a, n), kd = slice(k, a, n), vd = slice(v, a, n);
    const Fwd alone = forward(qd, kd, vd, Tensor(), scale);
    EXPECT_LE(rel_error(slice(packed.out, a, n), alone.out), tol) << "out";
    EXPECT_LE(rel_error(packed.lse.narrow(2, a, n).contiguous(), alone.lse), tol) << "lse";
    const Grads ga = backward(qd, kd, vd, Tensor(), alone, slice(dout, a, n), scale);
    EXPECT_LE(rel_error(slice(gp.dq, a, n), ga.dq), tol) << "dq";
    EXPECT_LE(rel_error(slice(gp.dk, a, n), ga.dk), tol) << "dk";
    EXPECT_LE(rel_error(slice(gp.dv, a, n), ga.dv), tol) << "dv";
    a += n;
  }
}

TEST(PackedAttentionKernel, PackedRowEqualsDocumentsAloneF64) {
  uint64_t seed = 11;
  for (const Case& c :
       {Case{DType::kF64, 4, 4, {5, 1, 9, 3}}, Case{DType::kF64, 4, 2, {5, 1, 9, 3}},
        Case{DType::kF64, 6, 1, {2, 7, 4}}, Case{DType::kF64, 2, 2, {1, 1, 1}}}) {
    check_packed_equals_per_document(c, 1e-12, seed++);
  }
}

TEST(PackedAttentionKernel, PackedRowEqualsDocumentsAloneF32) {
  uint64_t seed = 21;
  for (const Case& c :
       {Case{DType::kF32, 4, 4, {5, 1, 9, 3}}, Case{DType::kF32, 4, 2, {3, 8, 2, 6}}}) {
    check_packed_equals_per_document(c, 1e-6, seed++);
  }
}

// One document (doc_start all zero) is the plain causal kernel, bit for bit.
TEST(PackedAttentionKernel, AllZeroDocStartIsPlainCausal) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    Generator gen(31);
    const int64_t T = 13;
    const Tensor q = randn({2, 4, T, 6}, gen, dt), k = randn({2, 2, T, 6}, gen, dt),
                 v = randn({2, 2, T, 6}, gen, dt), dout = randn({2, 4, T, 6}, gen, dt);
    const Tensor zero = Tensor::zeros({T}, DType::kI32);
    const Fwd a = forward(q, k, v, zero, 0.4), b = forward(q, k, v, Tensor(), 0.4);
    EXPECT_EQ(a.out.to_vector(), b.out.to_vector());
    EXPECT_EQ(a.lse.to_vector(), b.lse.to_vector());
    const Grads ga = backward(q, k, v, zero, a, dout, 0.4),
                gb = backward(q, k, v, Tensor(), b, dout, 0.4);
    EXPECT_EQ(ga.dq.to_vector(), gb.dq.to_vector());
    EXPECT_EQ(ga.dk.to_vector(), gb.dk.to_vector());
    EXPECT_EQ(ga.dv.to_vector(), gb.dv.to_vector());
  }
}

// The same bits with 1, 2 and 3 threads (forward rows and backward kv heads split differently).
TEST(PackedAttentionKernel, ResultsDoNotDependOnThreadCount) {
  Generator gen(41);
  const std::vector<int64_t> docs = {4, 1, 12, 7};
  const Tensor ds = doc_start_of(docs);
  const int64_t T = 24;
  const Tensor q = randn({3, 4, T, 8}, gen, DType::kF32), k = randn({3, 2, T, 8}, gen, DType::kF32),
               v = randn({3, 2, T, 8}, gen, DType::kF32),
               dout = randn({3, 4, T, 8}, gen, DType::kF32);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<double>> ref;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const Fwd f = forward(q, k, v, ds, 0.3);
    const Grads g = backward(q, k, v, ds, f, dout, 0.3);
    const std::vector<std::vector<double>> got = {
        f.out.to_vector(), f.lse.to_vector(), g.dq.to_vector(), g.dk.to_vector(), g.dv.to_vector()};
    if (ref.empty()) ref = got;
    EXPECT_EQ(got, ref) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

// A sliding window (Note [Sliding window] in layers/transformer.cpp) is each row's first key
// moved up to i − W + 1: against the softmax written out over exactly the keys
// max(doc, i − W + 1) … i, in f64 (forward: out and lse).
TEST(PackedAttentionKernel, WindowedFirstKeysEqualTheWrittenOutSoftmax) {
  Generator gen(45);
  const int64_t T = 18, D = 4, W = 4, Hq = 4, Hkv = 2;
  const Tensor docs = doc_start_of({5, 1, 9, 3});
  std::vector<int32_t> first(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i)
    first[static_cast<size_t>(i)] =
        std::max(docs.data<int32_t>()[i], static_cast<int32_t>(i - W + 1));
  const Tensor q = randn({1, Hq, T, D}, gen, DType::kF64),
               k = randn({1, Hkv, T, D}, gen, DType::kF64),
               v = randn({1, Hkv, T, D}, gen, DType::kF64);
  const double scale = 0.6;
  const Fwd f = forward(q, k, v, Tensor::from_vector(first, {T}), scale);
  const double* qp = q.data<double>();
  const double* kp = k.data<double>();
  const double* vp = v.data<double>();
  double worst = 0;
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kvh = h / (Hq / Hkv);
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> s;
      for (int64_t j = first[static_cast<size_t>(i)]; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qp[(h * T + i) * D + d] * kp[(kvh * T + j) * D + d];
        s.push_back(scale * dot);
      }
      double m = -INFINITY, z = 0;
      for (double x : s) m = std::max(m, x);
      for (double x : s) z += std::exp(x - m);
      worst = std::max(worst, std::abs(f.lse.data<double>()[h * T + i] - (m + std::log(z))));
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (size_t n = 0; n < s.size(); ++n)
          o += std::exp(s[n] - m) / z *
               vp[(kvh * T + first[static_cast<size_t>(i)] + static_cast<int64_t>(n)) * D + d];
        worst = std::max(worst, std::abs(f.out.data<double>()[(h * T + i) * D + d] - o));
      }
    }
  }
  EXPECT_LE(worst, 1e-12);
  // And the window mattered: the documents alone give other rows.
  EXPECT_GT(rel_error(f.out, forward(q, k, v, docs, scale).out), 1e-3);
}

// The op's backward with windowed first keys against central differences in f64.
TEST(PackedAttentionOp, GradcheckWithSlidingWindow) {
  Generator gen(53);
  const Tensor first =
      Tensor::from_vector(std::vector<int32_t>{0, 0, 0, 1, 2, 5, 5, 6, 7, 8}, {10});
  std::vector<Tensor> in = {testing::random({2, 4, 10, 3}, gen),
                            testing::random({2, 2, 10, 3}, gen),
                            testing::random({2, 2, 10, 3}, gen)};
  testing::expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return ops::causal_attention(x[0], x[1], x[2], 0.0, first);
      },
      in);
}

// The op's backward against central differences in f64, grouped-query, documents of 1 to 4.
TEST(PackedAttentionOp, GradcheckWithDocStart) {
  Generator gen(51);
  const Tensor ds = doc_start_of({3, 1, 4, 2});
  const int64_t T = 10;
  std::vector<Tensor> in = {testing::random({2, 4, T, 3}, gen), testing::random({2, 2, T, 3}, gen),
                            testing::random({2, 2, T, 3}, gen)};
  testing::expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return ops::causal_attention(x[0], x[1], x[2], 0.0, ds);
      },
      in);
}

// The op's result equals the kernel's with the same doc_start (the op passes it on, and saves
// it: the backward's dk differs from the plain one's).
TEST(PackedAttentionOp, PassesDocStartToForwardAndBackward) {
  Generator gen(52);
  const Tensor ds = doc_start_of({2, 5});
  const Tensor q = testing::random({1, 2, 7, 4}, gen), k = testing::random({1, 2, 7, 4}, gen),
               v = testing::random({1, 2, 7, 4}, gen);
  const double scale = 0.5;
  const Tensor out = ops::causal_attention(q, k, v, scale, ds);
  const Fwd ref = forward(q.detach(), k.detach(), v.detach(), ds, scale);
  EXPECT_EQ(out.to_vector(), ref.out.to_vector());
  const Tensor dout = randn(q.shape(), gen, DType::kF64);
  autograd::backward(ops::sum(ops::mul(out, dout)));
  const Grads g = backward(q.detach(), k.detach(), v.detach(), ds, ref, dout, scale);
  EXPECT_EQ(k.grad().to_vector(), g.dk.to_vector());
  EXPECT_EQ(q.grad().to_vector(), g.dq.to_vector());
}

void expect_rejected(const Tensor& doc_start, const std::string& what) {
  Generator gen(61);
  const Tensor q = randn({1, 2, 6, 4}, gen, DType::kF64);
  try {
    ops::causal_attention(q, q, q, 0.0, doc_start);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("causal_attention"), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find("doc_start"), std::string::npos) << what << ": " << msg;
  }
}

TEST(PackedAttentionOp, RejectsMalformedDocStart) {
  const auto i32 = [](std::vector<int32_t> v) {
    const auto n = static_cast<int64_t>(v.size());
    return Tensor::from_vector(v, {n});
  };
  expect_rejected(i32({0, 0, 0, 0, 0}), "wrong length");
  expect_rejected(Tensor::zeros({6}, DType::kI64), "i64");
  expect_rejected(Tensor::zeros({2, 3}, DType::kI32), "2-d");
  expect_rejected(i32({1, 1, 1, 1, 1, 1}), "doc_start[0] != 0");
  expect_rejected(i32({0, 0, 2, 2, 0, 0}), "decreasing");
  expect_rejected(i32({0, 0, 0, 4, 4, 6}), "past the row");
  // Well-formed ones pass: every token alone, one document, three, a window of 3 keys.
  Generator gen(62);
  const Tensor q = randn({1, 2, 6, 4}, gen, DType::kF64);
  for (const Tensor& ok : {i32({0, 1, 2, 3, 4, 5}), i32({0, 0, 0, 0, 0, 0}),
                           i32({0, 0, 2, 3, 3, 3}), i32({0, 0, 0, 1, 2, 3})}) {
    EXPECT_NO_THROW(ops::causal_attention(q, q, q, 0.0, ok));
  }
}

}  // namespace
}  // namespace loom
