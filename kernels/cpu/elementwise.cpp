// kernels/cpu/elementwise.cpp — CPU binary arithmetic (with a row-broadcast fast path),
// scaling and axpy. Vectorised by the compiler (omp simd), parallel over fixed chunks.
#include "kernels/elementwise.h"

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

template <typename T>
inline T apply(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
    case BinaryOp::kDiv:
      return a / b;
  }
  return a;
}

template <typename T, BinaryOp Op>
void contiguous_loop(const T* a, const T* b, T* o, int64_t n) {
  parallel_for(n, kElementGrain, [&](int64_t lo, int64_t hi) {
    LOOM_SIMD
    for (int64_t i = lo; i < hi; ++i) o[i] = apply(Op, a[i], b[i]);
  });
}

// a contiguous (rows, cols), b a broadcast row (strides 0…0, 1): the bias pattern.
template <typename T, BinaryOp Op>
void row_broadcast_loop(const T* a, const T* b, T* o, int64_t rows, int64_t cols) {
  parallel_for(rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(cols, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r) {
                   const T* ar = a + r * cols;
                   T* orow = o + r * cols;
                   LOOM_SIMD
                   for (int64_t c = 0; c < cols; ++c) orow[c] = apply(Op, ar[c], b[c]);
                 }
               });
}

bool is_row_broadcast(const Tensor& t) {
  if (t.dim() == 0 || t.stride(-1) != 1) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.strides()[d] != 0 && t.shape()[d] != 1) return false;
  }
  return true;
}

template <BinaryOp Op>
void binary_typed(const Tensor& a, const Tensor& b, Tensor& out) {
  LOOM_DISPATCH_FLOAT(out.dtype(), "binary_forward", [&] {
    const scalar_t* pa = a.data<scalar_t>();
    const scalar_t* pb = b.data<scalar_t>();
    scalar_t* po = out.data<scalar_t>();
    const int64_t n = out.numel();
    if (a.is_contiguous() && b.is_contiguous() && out.is_contiguous()) {
      contiguous_loop<scalar_t, Op>(pa, pb, po, n);
    } else if (a.is_contiguous() && out.is_contiguous() && is_row_broadcast(b)) {
      const int64_t cols = out.size(-1);
      row_broadcast_loop<scalar_t, Op>(pa, pb, po, n / cols, cols);
    } else {
      strided_for<3>(
          out.shape(), {&a.strides(), &b.strides(), &out.strides()},
          [&](int64_t oa, int64_t ob, int64_t oo) { po[oo] = apply(Op, pa[oa], pb[ob]); });
    }
  });
}

void binary_forward_cpu(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::kAdd:
      return binary_typed<BinaryOp::kAdd>(a, b, out);
    case BinaryOp::kSub:
      return binary_typed<BinaryOp::kSub>(a, b, out);
    case BinaryOp::kMul:
      return binary_typed<BinaryOp::kMul>(a, b, out);
    case BinaryOp::kDiv:
      return binary_typed<BinaryOp::kDiv>(a, b, out);
  }
}

void scale_forward_cpu(const Tensor& x, double alpha, Tensor& out) {
  LOOM_DISPATCH_FLOAT(x.dtype(), "scale_forward", [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* po = out.data<scalar_t>();
    const scalar_t s = static_cast<scalar_t>(alpha);
    if (x.is_contiguous()) {
      parallel_for(x.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
        LOOM_SIMD
        for (int64_t i = lo; i < hi; ++i) po[i] = s * px[i];
      });
    } else {
      strided_for<2>(x.shape(), {&x.strides(), &out.strides()},
                     [&](int64_t ox, int64_t oo) { po[oo] = s * px[ox]; });
    }
  });
}

void axpy_cpu(double alpha, const Tensor& x, Tensor& y) {
  LOOM_CHECK(x.shape() == y.shape() && y.is_contiguous(),
             "axpy: y must be contiguous with x's shape");
  LOOM_DISPATCH_FLOAT(y.dtype(), "axpy", [&] {
    const scalar_t* px = x.data<scalar_t>();
    scalar_t* py = y.data<scalar_t>();
    const scalar_t a = static_cast<scalar_t>(alpha);
    if (x.is_contiguous()) {
      parallel_for(x.numel(), kElementGrain, [&](int64_t lo, int64_t hi) {
        LOOM_SIMD
        for (int64_t i = lo; i < hi; ++i) py[i] += a * px[i];
      });
    } else {
      strided_for<2>(x.shape(), {&x.strides(), &y.strides()},
                     [&](int64_t ox, int64_t oy) { py[oy] += a * px[ox]; });
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(binary_forward, kCpu, binary_forward_cpu);
LOOM_REGISTER_KERNEL(scale_forward, kCpu, scale_forward_cpu);
LOOM_REGISTER_KERNEL(axpy, kCpu, axpy_cpu);

}  // namespace loom::kernels::cpu
