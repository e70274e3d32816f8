// kernels/cpu/attention_block.cpp — CPU block attention for ring attention (Note [Attention
// block kernel contract] in kernels/attention_block.h). Forward: parallel over query rows, one
// row of scores as scratch. Backward: parallel over (batch, kv head), one thread per kv head
// handling every query head of its group, so each of dq, dk, dv has one writer per element and
// a fixed summation order (thread-count independent).
#include "kernels/attention_block.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

struct BlockDims {
  int64_t b, hq, hkv, tq, tk, d;
};

BlockDims block_dims(const Tensor& q, const Tensor& k, const Tensor& v, const char* name) {
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape(), name,
             ": q must be (B, Hq, Tq, D) and k, v (B, Hkv, Tk, D), got ", shape_str(q.shape()),
             ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  const BlockDims s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  LOOM_CHECK(k.size(0) == s.b && k.size(3) == s.d && s.hkv > 0 && s.hq % s.hkv == 0, name, ": q ",
             shape_str(q.shape()), " and k ", shape_str(k.shape()), " do not match");
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
T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
  LOOM_SIMD_SUM(acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename T>
void axpy_row(T alpha, const T* x, T* y, int64_t n) {
  LOOM_SIMD
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Keys visible to a query at global position qpos: rows [0, visible) of the block.
int64_t visible(int64_t qpos, int64_t k_offset, int64_t tk) {
  return std::clamp<int64_t>(qpos - k_offset + 1, 0, tk);
}

template <typename T>
void forward_typed(const T* q, const T* k, const T* v, const BlockDims& s, int64_t q_offset,
                   int64_t k_offset, T scale, T* out, T* lse) {
  const int64_t group = s.hq / s.hkv;
  const int64_t grain = std::max<int64_t>(1, kElementGrain / std::max<int64_t>(s.tk * s.d, 1));
  parallel_for(s.b * s.hq * s.tq, grain, [&](int64_t lo, int64_t hi) {
    std::vector<T> sc(static_cast<size_t>(std::max<int64_t>(s.tk, 1)));
    for (int64_t r = lo; r < hi; ++r) {  // r indexes (b, h, i)
      const int64_t i = r % s.tq, h = (r / s.tq) % s.hq, b = r / (s.tq * s.hq);
      const int64_t kv_off = (b * s.hkv + h / group) * s.tk * s.d;
      const int64_t n = visible(q_offset + i, k_offset, s.tk);
      T* o = out + r * s.d;
      std::fill(o, o + s.d, T(0));
      if (n == 0) {
        lse[r] = -std::numeric_limits<T>::infinity();
        continue;
      }
      const T* qi = q + r * s.d;
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = scale * dot(qi, k + kv_off + j * s.d, s.d);
        m = std::max(m, sc[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = std::exp(sc[j] - m);
        l += static_cast<double>(sc[j]);
      }
      for (int64_t j = 0; j < n; ++j) axpy_row(sc[j], v + kv_off + j * s.d, o, s.d);
      const T inv = static_cast<T>(1.0 / l);
      LOOM_SIMD
      for (int64_t c = 0; c < s.d; ++c) o[c] *= inv;
      lse[r] = static_cast<T>(static_cast<double>(m) + std::log(l));
    }
  });
}

void attention_block_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                 int64_t q_offset, int64_t k_offset, double scale, Tensor& out,
                                 Tensor& lse) {
  const char* name = "attention_block_forward";
  const BlockDims s = block_dims(q, k, v, name);
  check_like(out, q.shape(), q.dtype(), name, "out");
  check_like(lse, {s.b, s.hq, s.tq}, q.dtype(), name, "lse");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  LOOM_DISPATCH_FLOAT(q.dtype(), name, [&] {
    forward_typed<scalar_t>(q.data<scalar_t>(), k.data<scalar_t>(), v.data<scalar_t>(), s, q_offset,
                            k_offset, static_cast<scalar_t>(scale), out.data<scalar_t>(),
                            lse.data<scalar_t>());
  });
}

template <typename T>
void merge_typed(T* out, T* lse, const T* bout, const T* blse, int64_t rows, int64_t d) {
  parallel_for(rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(d, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r) {
                   if (std::isinf(blse[r]) && blse[r] < 0) continue;
                   const double a = lse[r], b = blse[r];
                   const double m = std::max(a, b);
                   const double l = m + std::log(std::exp(a - m) + std::exp(b - m));
                   const T wa = static_cast<T>(std::exp(a - l)),
                           wb = static_cast<T>(std::exp(b - l));
                   T* o = out + r * d;
                   const T* bo = bout + r * d;
                   LOOM_SIMD
                   for (int64_t c = 0; c < d; ++c) o[c] = wa * o[c] + wb * bo[c];
                   lse[r] = static_cast<T>(l);
                 }
               });
}

void attention_block_merge_cpu(Tensor& out, Tensor& lse, const Tensor& block_out,
                               const Tensor& block_lse) {
  const char* name = "attention_block_merge";
  LOOM_CHECK(out.dim() == 4 && out.is_contiguous(), name,
             ": out must be contiguous (B, H, T, D), got ", shape_str(out.shape()));
  const Shape rows_shape{out.size(0), out.size(1), out.size(2)};
  check_like(lse, rows_shape, out.dtype(), name, "lse");
  check_like(block_out, out.shape(), out.dtype(), name, "block_out");
  check_like(block_lse, rows_shape, out.dtype(), name, "block_lse");
  LOOM_DISPATCH_FLOAT(out.dtype(), name, [&] {
    merge_typed<scalar_t>(out.data<scalar_t>(), lse.data<scalar_t>(), block_out.data<scalar_t>(),
                          block_lse.data<scalar_t>(), lse.numel(), out.size(3));
  });
}

template <typename T>
struct BlockGrads {
  const T *q, *k, *v, *lse, *delta, *dout;
  T *dq, *dk, *dv;
};

template <typename T>
void backward_typed(const BlockGrads<T>& g, const BlockDims& s, int64_t q_offset, int64_t k_offset,
                    T scale) {
  const int64_t group = s.hq / s.hkv;
  parallel_for(s.b * s.hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> p(static_cast<size_t>(std::max<int64_t>(s.tk, 1)));
    std::vector<T> ds(p.size()), dqr(static_cast<size_t>(s.d));
    for (int64_t task = lo; task < hi; ++task) {  // (b, kv head)
      const int64_t b = task / s.hkv, kvh = task % s.hkv;
      const int64_t kv_off = task * s.tk * s.d;
      const T* k = g.k + kv_off;
      const T* v = g.v + kv_off;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i = 0; i < s.tq; ++i) {
          const int64_t r = (b * s.hq + h) * s.tq + i;
          const int64_t n = visible(q_offset + i, k_offset, s.tk);
          if (n == 0) continue;
          const T* qi = g.q + r * s.d;
          const T* doi = g.dout + r * s.d;
          for (int64_t j = 0; j < n; ++j) {
            p[j] = std::exp(scale * dot(qi, k + j * s.d, s.d) - g.lse[r]);
            ds[j] = p[j] * (dot(doi, v + j * s.d, s.d) - g.delta[r]);
          }
          std::fill(dqr.begin(), dqr.end(), T(0));
          for (int64_t j = 0; j < n; ++j) {
            axpy_row(ds[j], k + j * s.d, dqr.data(), s.d);
            axpy_row(scale * ds[j], qi, g.dk + kv_off + j * s.d, s.d);
            axpy_row(p[j], doi, g.dv + kv_off + j * s.d, s.d);
          }
          axpy_row(scale, dqr.data(), g.dq + r * s.d, s.d);
        }
      }
    }
  });
}

void attention_block_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& lse, const Tensor& delta, const Tensor& dout,
                                  int64_t q_offset, int64_t k_offset, double scale, Tensor& dq,
                                  Tensor& dk, Tensor& dv) {
  const char* name = "attention_block_backward";
  const BlockDims s = block_dims(q, k, v, name);
  check_like(lse, {s.b, s.hq, s.tq}, q.dtype(), name, "lse");
  check_like(delta, {s.b, s.hq, s.tq}, q.dtype(), name, "delta");
  check_like(dout, q.shape(), q.dtype(), name, "dout");
  check_like(dq, q.shape(), q.dtype(), name, "dq");
  check_like(dk, k.shape(), q.dtype(), name, "dk");
  check_like(dv, v.shape(), q.dtype(), name, "dv");
  LOOM_CHECK(scale > 0, name, ": scale must be positive, got ", scale);
  LOOM_DISPATCH_FLOAT(q.dtype(), name, [&] {
    using T = scalar_t;
    const BlockGrads<T> g{q.data<T>(),   k.data<T>(),     v.data<T>(),
                          lse.data<T>(), delta.data<T>(), dout.data<T>(),
                          dq.data<T>(),  dk.data<T>(),    dv.data<T>()};
    backward_typed<T>(g, s, q_offset, k_offset, static_cast<T>(scale));
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(attention_block_forward, kCpu, attention_block_forward_cpu);
LOOM_REGISTER_KERNEL(attention_block_merge, kCpu, attention_block_merge_cpu);
LOOM_REGISTER_KERNEL(attention_block_backward, kCpu, attention_block_backward_cpu);

}  // namespace loom::kernels::cpu
