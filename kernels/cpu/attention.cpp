// kernels/cpu/attention.cpp — CPU causal attention, forward and backward (Note [Attention
// kernel contract] in kernels/attention.h). Forward: parallel over query rows, each with one
// row of scores as scratch. Backward: parallel over (batch, kv head); one thread handles every
// query head of its group, so dq, dk and dv each have one writer and a fixed summation order.
// With packed documents (Note [Packed documents]) row i's loops run over keys
// [doc_start[i], i] only, so key j meets only the query rows of its own document.
// Nothing here depends on the thread count; no T×T buffer is ever allocated.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

struct AttnDims {
  int64_t b, hq, hkv, t, d;
};

AttnDims attn_dims(const Tensor& q, const Tensor& k, const Tensor& v, const char* name) {
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape(), name,
             ": q must be (B, Hq, T, D) and k, v (B, Hkv, T, D), got ", shape_str(q.shape()), ", ",
             shape_str(k.shape()), ", ", shape_str(v.shape()));
  const AttnDims s{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3)};
  LOOM_CHECK(
      k.size(0) == s.b && k.size(2) == s.t && k.size(3) == s.d && s.hkv > 0 && s.hq % s.hkv == 0,
      name, ": q ", shape_str(q.shape()), " and k ", shape_str(k.shape()), " do not match");
  LOOM_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous(), name,
             ": tensors must be contiguous");
  LOOM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), name, ": dtypes differ");
  return s;
}

void check_like(const Tensor& t, const Shape& shape, DType dtype, const char* name,
                const char* what) {
  LOOM_CHECK(t.shape() == shape && t.dtype() == dtype && t.is_contiguous(), name, ": ", what,
             " must be contiguous ", shape_str(shape), " ", dtype_name(dtype), ", got ",
             shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
  LOOM_SIMD_SUM(acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// y (n) += alpha · x (n)
template <typename T>
inline void axpy_row(T alpha, const T* x, T* y, int64_t n) {
  LOOM_SIMD
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// The first key row i sees: doc_start[i], or 0 without packed documents.
inline int64_t first_key(const int32_t* doc_start, int64_t i) {
  return doc_start ? doc_start[i] : 0;
}

// One query row at position i seeing keys [lo, i]: qi (D), k and v (T, D) of its kv head,
// scratch s (≥ i + 1). Writes o (D) = softmax(scale · qi·k_{lo..i}) v_{lo..i} and returns the
// row's log-sum-exp.
template <typename T>
T attend_row(const T* qi, const T* k, const T* v, int64_t lo, int64_t i, int64_t d, T scale, T* s,
             T* o) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = lo; j <= i; ++j) {
    s[j] = scale * dot(qi, k + j * d, d);
    m = std::max(m, s[j]);
  }
  double l = 0;
  for (int64_t j = lo; j <= i; ++j) {
    s[j] = std::exp(s[j] - m);
    l += static_cast<double>(s[j]);
  }
  std::fill(o, o + d, T(0));
  for (int64_t j = lo; j <= i; ++j) axpy_row(s[j], v + j * d, o, d);
  const T inv = static_cast<T>(1.0 / l);
  LOOM_SIMD
  for (int64_t c = 0; c < d; ++c) o[c] *= inv;
  return static_cast<T>(static_cast<double>(m) + std::log(l));
}

// q (B,Hq,T,D), k, v (B,Hkv,T,D), doc_start (T) or null → out (B,Hq,T,D), lse (B,Hq,T).
template <typename T>
void forward_typed(const T* q, const T* k, const T* v, const int32_t* doc_start, const AttnDims& s,
                   T scale, T* out, T* lse) {
  const int64_t group = s.hq / s.hkv;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(s.t * s.d, 1));
  parallel_for(s.b * s.hq * s.t, grain, [&](int64_t lo, int64_t hi) {
    std::vector<T> scores(static_cast<size_t>(s.t));
    for (int64_t r = lo; r < hi; ++r) {  // r indexes (b, h, i)
      const int64_t i = r % s.t, h = (r / s.t) % s.hq, b = r / (s.t * s.hq);
      const int64_t kv_off = (b * s.hkv + h / group) * s.t * s.d;
      lse[r] = attend_row(q + r * s.d, k + kv_off, v + kv_off, first_key(doc_start, i), i, s.d,
                          scale, scores.data(), out + r * s.d);
    }
  });
}

// doc_start's data, or null when undefined (checked against the contract first).
const int32_t* doc_starts(const Tensor& doc_start, int64_t t, const char* name) {
  check_doc_start(doc_start, t, name);
  return doc_start.defined() ? doc_start.data<int32_t>() : nullptr;
}

void attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& doc_start, double scale, Tensor& out, Tensor& lse) {
  const AttnDims s = attn_dims(q, k, v, "attention_forward");
  const int32_t* ds = doc_starts(doc_start, s.t, "attention_forward");
  check_like(out, q.shape(), q.dtype(), "attention_forward", "out");
  check_like(lse, {s.b, s.hq, s.t}, q.dtype(), "attention_forward", "lse");
  LOOM_CHECK(scale > 0, "attention_forward: scale must be positive, got ", scale);
  LOOM_DISPATCH_FLOAT(q.dtype(), "attention_forward", [&] {
    forward_typed<scalar_t>(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(), ds, s,
                            static_cast<scalar_t>(scale), out.data<scalar_t>(),
                            lse.data<scalar_t>());
  });
}

template <typename T>
struct BackwardBuffers {
  const T *q, *k, *v, *out, *lse, *dout;
  T *dq, *dk, *dv;
  const int32_t* doc_start;  // null: one document
};

// Scratch for one thread: probabilities and score gradients of a row (T), and dq's row (D).
template <typename T>
struct RowScratch {
  std::vector<T> p, ds, dq;
};

// Query row r of (B,Hq,T) at position i, against the kv head starting at kv_off; accumulates
// into dq's row r and into rows lo..i of that kv head's dk, dv (lo: the row's first key).
template <typename T>
void backward_row(const BackwardBuffers<T>& bb, int64_t r, int64_t i, int64_t kv_off, int64_t d,
                  T scale, RowScratch<T>& w) {
  const T* qi = bb.q + r * d;
  const T* doi = bb.dout + r * d;
  const T* k = bb.k + kv_off;
  const T* v = bb.v + kv_off;
  const T di = dot(doi, bb.out + r * d, d);
  const T lse = bb.lse[r];
  const int64_t lo = first_key(bb.doc_start, i);
  for (int64_t j = lo; j <= i; ++j) {
    w.p[j] = std::exp(scale * dot(qi, k + j * d, d) - lse);
    w.ds[j] = w.p[j] * (dot(doi, v + j * d, d) - di);
  }
  std::fill(w.dq.begin(), w.dq.end(), T(0));
  T* dk = bb.dk + kv_off;
  T* dv = bb.dv + kv_off;
  for (int64_t j = lo; j <= i; ++j) {
    axpy_row(w.ds[j], k + j * d, w.dq.data(), d);
    axpy_row(scale * w.ds[j], qi, dk + j * d, d);
    axpy_row(w.p[j], doi, dv + j * d, d);
  }
  axpy_row(scale, w.dq.data(), bb.dq + r * d, d);
}

template <typename T>
void backward_typed(const BackwardBuffers<T>& bb, const AttnDims& s, T scale) {
  const int64_t group = s.hq / s.hkv;
  parallel_for(s.b * s.hkv, 1, [&](int64_t lo, int64_t hi) {
    RowScratch<T> w{std::vector<T>(static_cast<size_t>(s.t)),
                    std::vector<T>(static_cast<size_t>(s.t)),
                    std::vector<T>(static_cast<size_t>(s.d))};
    for (int64_t task = lo; task < hi; ++task) {  // task indexes (b, kv head)
      const int64_t b = task / s.hkv, kvh = task % s.hkv;
      const int64_t kv_off = task * s.t * s.d;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i = 0; i < s.t; ++i) {
          backward_row(bb, (b * s.hq + h) * s.t + i, i, kv_off, s.d, scale, w);
        }
      }
    }
  });
}

void attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& doc_start, const Tensor& out, const Tensor& lse,
                            const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* name = "attention_backward";
  const AttnDims s = attn_dims(q, k, v, name);
  const int32_t* ds = doc_starts(doc_start, s.t, name);
  check_like(out, q.shape(), q.dtype(), name, "out");
  check_like(dout, q.shape(), q.dtype(), name, "dout");
  check_like(lse, {s.b, s.hq, s.t}, q.dtype(), name, "lse");
  check_like(dq, q.shape(), q.dtype(), name, "dq");
  check_like(dk, k.shape(), q.dtype(), name, "dk");
  check_like(dv, v.shape(), q.dtype(), name, "dv");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  LOOM_DISPATCH_FLOAT(q.dtype(), "attention_backward", [&] {
    using T = scalar_t;
    const BackwardBuffers<T> bb{
        q.data<T>(),    k.data<T>(),  v.data<T>(),  out.data<T>(), lse.data<T>(),
        dout.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(),  ds};
    backward_typed<T>(bb, s, static_cast<T>(scale));
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(attention_forward, kCpu, attention_forward_cpu);
LOOM_REGISTER_KERNEL(attention_backward, kCpu, attention_backward_cpu);

}  // namespace loom::kernels::cpu
