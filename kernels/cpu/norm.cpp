// kernels/cpu/norm.cpp — CPU LayerNorm and RMSNorm, forward and backward, and the residual add +
// LayerNorm pair (the sum, then LayerNorm of it). Rows are independent and split across threads;
// row statistics accumulate in f64. dweight/dbias are summed over rows per Note [Deterministic
// row reductions] in kernels/norm.h. Outputs come from the caller.
#include "kernels/norm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

// Rows per parallel task for row-wise work (any split: each row is done by one thread).
int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1));
}

// Partial column sums over fixed chunks of rows (Note [Deterministic row reductions]).
// `parts` partial vectors of `cols` each per chunk (dweight, and dbias when parts == 2).
struct RowChunks {
  int64_t rows, cols, parts, chunk, count;
  std::vector<double> partial;  // (count, parts, cols)
  RowChunks(int64_t r, int64_t c, int64_t p)
      : rows(r),
        cols(c),
        parts(p),
        chunk(std::max<int64_t>(kNormRowChunk, (r + kNormMaxChunks - 1) / kNormMaxChunks)),
        count((r + chunk - 1) / chunk),
        partial(static_cast<size_t>(count * parts * cols), 0.0) {}
  double* at(int64_t k, int64_t part) { return partial.data() + (k * parts + part) * cols; }

  // out_part[c] += Σ_k partial[k, part, c], chunks added in order.
  template <typename T>
  void reduce_into(int64_t part, T* out) {
    constexpr int64_t kBlock = 256;
    parallel_for(cols, kBlock, [&](int64_t lo, int64_t hi) {
      double acc[kBlock] = {};
      for (int64_t k = 0; k < count; ++k) {
        const double* p = at(k, part);
        LOOM_SIMD
        for (int64_t c = lo; c < hi; ++c) acc[c - lo] += p[c];
      }
      for (int64_t c = lo; c < hi; ++c) out[c] += static_cast<T>(acc[c - lo]);
    });
  }
};

template <typename T>
void layer_norm_forward_typed(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                              Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  T* py = y.data<T>();
  T* pm = mean.data<T>();
  T* pr = rstd.data<T>();
  parallel_for(rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = px + r * cols;
      T* yr = py + r * cols;
      double s = 0, v = 0;
      LOOM_SIMD_SUM(s)
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(xr[c]);
      const double mu = s / static_cast<double>(cols);
      LOOM_SIMD_SUM(v)
      for (int64_t c = 0; c < cols; ++c) v += (xr[c] - mu) * (xr[c] - mu);
      pm[r] = static_cast<T>(mu);
      pr[r] = static_cast<T>(1.0 / std::sqrt(v / static_cast<double>(cols) + eps));
      const T m = pm[r], q = pr[r];
      if (pb != nullptr) {
        LOOM_SIMD
        for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * q * pw[c] + pb[c];
      } else {
        LOOM_SIMD
        for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * q * pw[c];
      }
    }
  });
}

// One row of LayerNorm backward: dy, x, w, dx (C); m, q this row's mean and rstd; pdw, pdb (C)
// the chunk's partial sums (pdb null without bias).
template <typename T>
void layer_norm_backward_row(const T* dy, const T* x, const T* w, T m, T q, int64_t cols, T* dx,
                             double* pdw, double* pdb) {
  double sg = 0, sgx = 0;
  _Pragma("omp simd reduction(+ : sg, sgx)") for (int64_t c = 0; c < cols; ++c) {
    const T g = dy[c] * w[c];
    sg += g;
    sgx += g * ((x[c] - m) * q);
  }
  const T a = static_cast<T>(sg / static_cast<double>(cols));
  const T bq = static_cast<T>(sgx / static_cast<double>(cols));
  LOOM_SIMD
  for (int64_t c = 0; c < cols; ++c) {
    const T xh = (x[c] - m) * q;
    dx[c] += q * (dy[c] * w[c] - a - xh * bq);
    pdw[c] += dy[c] * xh;
  }
  if (pdb != nullptr) {
    LOOM_SIMD
    for (int64_t c = 0; c < cols; ++c) pdb[c] += dy[c];
  }
}

template <typename T>
void layer_norm_backward_typed(const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dw,
                               Tensor& db) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pm = mean.data<T>();
  const T* pr = rstd.data<T>();
  T* pdx = dx.data<T>();
  RowChunks chunks(rows, cols, db.defined() ? 2 : 1);
  parallel_for(chunks.count, 1, [&](int64_t klo, int64_t khi) {
    for (int64_t k = klo; k < khi; ++k) {
      double* pdw = chunks.at(k, 0);
      double* pdb = chunks.parts == 2 ? chunks.at(k, 1) : nullptr;
      const int64_t end = std::min(rows, (k + 1) * chunks.chunk);
      for (int64_t r = k * chunks.chunk; r < end; ++r) {
        layer_norm_backward_row(pdy + r * cols, px + r * cols, pw, pm[r], pr[r], cols,
                                pdx + r * cols, pdw, pdb);
      }
    }
  });
  chunks.reduce_into(0, dw.data<T>());
  if (db.defined()) chunks.reduce_into(1, db.data<T>());
}

template <typename T>
void rms_norm_forward_typed(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  T* py = y.data<T>();
  T* pr = rstd.data<T>();
  parallel_for(rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = px + r * cols;
      T* yr = py + r * cols;
      double ss = 0;
      LOOM_SIMD_SUM(ss)
      for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
      pr[r] = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(cols) + eps));
      const T q = pr[r];
      LOOM_SIMD
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * q * pw[c];
    }
  });
}

// One row of RMSNorm backward: dy, x, w, dx (C); q this row's rstd; pdw (C) the chunk's partial.
template <typename T>
void rms_norm_backward_row(const T* dy, const T* x, const T* w, T q, int64_t cols, T* dx,
                           double* pdw) {
  double sgx = 0;
  LOOM_SIMD_SUM(sgx)
  for (int64_t c = 0; c < cols; ++c) sgx += dy[c] * w[c] * (x[c] * q);
  const T bq = static_cast<T>(sgx / static_cast<double>(cols));
  LOOM_SIMD
  for (int64_t c = 0; c < cols; ++c) {
    const T xh = x[c] * q;
    dx[c] += q * (dy[c] * w[c] - xh * bq);
    pdw[c] += dy[c] * xh;
  }
}

template <typename T>
void rms_norm_backward_typed(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                             Tensor& dx, Tensor& dw) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pr = rstd.data<T>();
  T* pdx = dx.data<T>();
  RowChunks chunks(rows, cols, 1);
  parallel_for(chunks.count, 1, [&](int64_t klo, int64_t khi) {
    for (int64_t k = klo; k < khi; ++k) {
      const int64_t end = std::min(rows, (k + 1) * chunks.chunk);
      for (int64_t r = k * chunks.chunk; r < end; ++r) {
        rms_norm_backward_row(pdy + r * cols, px + r * cols, pw, pr[r], cols, pdx + r * cols,
                              chunks.at(k, 0));
      }
    }
  });
  chunks.reduce_into(0, dw.data<T>());
}

void layer_norm_forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                            Tensor& y, Tensor& mean, Tensor& rstd) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "layer_norm_forward", [&] {
    layer_norm_forward_typed<scalar_t>(x, weight, bias, eps, y, mean, rstd);
  });
}

void layer_norm_backward_cpu(const Tensor& dy, const Tensor& x, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                             Tensor& dbias) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    layer_norm_backward_typed<scalar_t>(dy, x, weight, mean, rstd, dx, dweight, dbias);
  });
}

void rms_norm_forward_cpu(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                          Tensor& rstd) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "rms_norm_forward",
                      [&] { rms_norm_forward_typed<scalar_t>(x, weight, eps, y, rstd); });
}

void rms_norm_backward_cpu(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "rms_norm_backward",
                      [&] { rms_norm_backward_typed<scalar_t>(dy, x, weight, rstd, dx, dweight); });
}

// out[i] = a[i] + b[i], or out[i] += a[i] when b is null; n elements.
template <typename T>
void add_elements(const T* a, const T* b, T* out, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    if (b != nullptr) {
      LOOM_SIMD
      for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
    } else {
      LOOM_SIMD
      for (int64_t i = lo; i < hi; ++i) out[i] += a[i];
    }
  });
}

void residual_layer_norm_forward_cpu(const Tensor& x, const Tensor& r, const Tensor& weight,
                                     const Tensor& bias, double eps, Tensor& s, Tensor& y,
                                     Tensor& mean, Tensor& rstd) {
  LOOM_CHECK(r.shape() == x.shape() && s.shape() == x.shape() && r.dtype() == x.dtype() &&
                 s.dtype() == x.dtype(),
             "residual_layer_norm_forward: x, r and s must have the same shape and dtype");
  LOOM_DISPATCH_FLOAT(x.dtype(), "residual_layer_norm_forward", [&] {
    add_elements(x.data<scalar_t>(), r.data<scalar_t>(), s.data<scalar_t>(), x.numel());
    layer_norm_forward_typed<scalar_t>(s, weight, bias, eps, y, mean, rstd);
  });
}

void residual_layer_norm_backward_cpu(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      Tensor& dx, Tensor& dweight, Tensor& dbias) {
  LOOM_CHECK(!ds.defined() || (ds.shape() == dx.shape() && ds.dtype() == dx.dtype()),
             "residual_layer_norm_backward: ds must match dx");
  LOOM_DISPATCH_FLOAT(s.dtype(), "residual_layer_norm_backward", [&] {
    if (ds.defined()) {
      add_elements<scalar_t>(ds.data<scalar_t>(), nullptr, dx.data<scalar_t>(), dx.numel());
    }
    layer_norm_backward_typed<scalar_t>(dy, s, weight, mean, rstd, dx, dweight, dbias);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(residual_layer_norm_forward, kCpu, residual_layer_norm_forward_cpu);
LOOM_REGISTER_KERNEL(residual_layer_norm_backward, kCpu, residual_layer_norm_backward_cpu);
LOOM_REGISTER_KERNEL(layer_norm_forward, kCpu, layer_norm_forward_cpu);
LOOM_REGISTER_KERNEL(layer_norm_backward, kCpu, layer_norm_backward_cpu);
LOOM_REGISTER_KERNEL(rms_norm_forward, kCpu, rms_norm_forward_cpu);
LOOM_REGISTER_KERNEL(rms_norm_backward, kCpu, rms_norm_backward_cpu);

}  // namespace loom::kernels::cpu
