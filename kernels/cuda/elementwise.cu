// kernels/cuda/elementwise.cu — CUDA binary arithmetic on broadcast operands (contiguous,
// row-broadcast and general strided paths), scaling and axpy; the contracts of
// kernels/elementwise.h. f32/f64 compute in their own type, bf16/f16 in f32; every product and
// sum is rounded once (no FMA contraction). Runs on the compute stream; must not synchronise the
// host.
#include "kernels/cuda/vec_map.cuh"
#include "kernels/elementwise.h"

namespace loom::kernels::cuda {
namespace {

template <BinaryOp Op, typename C>
__device__ __forceinline__ C apply_op(C a, C b) {
  if constexpr (Op == BinaryOp::kAdd) {
    return add_rn(a, b);
  } else if constexpr (Op == BinaryOp::kSub) {
    return sub_rn(a, b);
  } else if constexpr (Op == BinaryOp::kMul) {
    return mul_rn(a, b);
  } else {
    return a / b;
  }
}

// y = a ∘ b (inputs a, b).
template <BinaryOp Op>
struct BinaryFn {
  static constexpr bool kReadsOut = false;
  template <int V, typename C>
  __device__ void apply(int64_t, C (&x)[2][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) y[0][j] = apply_op<Op>(x[0][j], x[1][j]);
  }
};

// y = a ∘ row[(first + j) % cols] (input a; row a contiguous run of cols elements).
template <BinaryOp Op, typename T>
struct RowBroadcastFn {
  static constexpr bool kReadsOut = false;
  const T* row;
  int64_t cols;
  template <int V, typename C>
  __device__ void apply(int64_t first, C (&x)[1][V], C (&y)[1][V]) const {
    int64_t c = first % cols;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      y[0][j] = apply_op<Op>(x[0][j], convert<C>(row[c]));
      c = c + 1 == cols ? 0 : c + 1;
    }
  }
};

// y = s · x
template <typename C>
struct ScaleFn {
  static constexpr bool kReadsOut = false;
  C s;
  template <int V>
  __device__ void apply(int64_t, C (&x)[1][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) y[0][j] = mul_rn(s, x[0][j]);
  }
};

// y += a · x
template <typename C>
struct AxpyFn {
  static constexpr bool kReadsOut = true;
  C a;
  template <int V>
  __device__ void apply(int64_t, C (&x)[1][V], C (&y)[1][V]) const {
#pragma unroll
    for (int j = 0; j < V; ++j) y[0][j] = add_rn(y[0][j], mul_rn(a, x[0][j]));
  }
};

// b is a broadcast row: stride 1 in the last dim, 0 (or size 1) everywhere else.
bool is_row_broadcast(const Tensor& t) {
  if (t.dim() == 0 || t.stride(-1) != 1) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.strides()[d] != 0 && t.shape()[d] != 1) return false;
  }
  return true;
}

template <BinaryOp Op>
void binary_typed(const Tensor& a, const Tensor& b, Tensor& out) {
  LOOM_CUDA_DISPATCH_FLOAT(out.dtype(), "binary_forward", [&] {
    using T = scalar_t;
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    const int64_t n = out.numel();
    if (a.is_contiguous() && b.is_contiguous() && out.is_contiguous()) {
      MapPtrs<2, 1, T> p;
      p.in[0] = pa;
      p.in[1] = pb;
      p.out[0] = po;
      launch_map<T>(p, n, BinaryFn<Op>{});
    } else if (a.is_contiguous() && out.is_contiguous() && is_row_broadcast(b)) {
      MapPtrs<1, 1, T> p;
      p.in[0] = pa;
      p.out[0] = po;
      launch_map<T>(p, n, RowBroadcastFn<Op, T>{pb, out.size(-1)});
    } else {
      MapPtrs<2, 1, T> p;
      p.in[0] = pa;
      p.in[1] = pb;
      p.out[0] = po;
      launch_strided_map<T, 2, 1>(p, out.shape(), {&a.strides(), &b.strides(), &out.strides()},
                                  BinaryFn<Op>{}, "binary_forward");
    }
  });
}

void binary_forward_cuda(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  LOOM_CHECK(a.shape() == out.shape() && b.shape() == out.shape(), "binary_forward: shapes ",
             shape_str(a.shape()), ", ", shape_str(b.shape()), " and ", shape_str(out.shape()),
             " must match (operands are expanded first)");
  LOOM_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "binary_forward: dtypes ",
             dtype_name(a.dtype()), ", ", dtype_name(b.dtype()), " and ", dtype_name(out.dtype()),
             " must match");
  if (out.numel() == 0) return;
  CudaDeviceGuard guard(out.device().index);
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

void scale_forward_cuda(const Tensor& x, double alpha, Tensor& out) {
  LOOM_CHECK(x.shape() == out.shape() && x.dtype() == out.dtype(),
             "scale_forward: out must have x's shape and dtype");
  if (x.numel() == 0) return;
  CudaDeviceGuard guard(out.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(x.dtype(), "scale_forward", [&] {
    using T = scalar_t;
    using C = compute_t<T>;
    MapPtrs<1, 1, T> p;
    p.in[0] = static_cast<const T*>(x.raw_data());
    p.out[0] = static_cast<T*>(out.raw_data());
    const ScaleFn<C> f{static_cast<C>(alpha)};
    if (x.is_contiguous() && out.is_contiguous()) {
      launch_map<T>(p, x.numel(), f);
    } else {
      launch_strided_map<T, 1, 1>(p, x.shape(), {&x.strides(), &out.strides()}, f, "scale_forward");
    }
  });
}

void axpy_cuda(double alpha, const Tensor& x, Tensor& y) {
  LOOM_CHECK(x.shape() == y.shape() && y.is_contiguous(),
             "axpy: y must be contiguous with x's shape");
  LOOM_CHECK(x.dtype() == y.dtype(), "axpy: dtypes ", dtype_name(x.dtype()), " and ",
             dtype_name(y.dtype()), " differ");
  if (y.numel() == 0) return;
  CudaDeviceGuard guard(y.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(y.dtype(), "axpy", [&] {
    using T = scalar_t;
    using C = compute_t<T>;
    MapPtrs<1, 1, T> p;
    p.in[0] = static_cast<const T*>(x.raw_data());
    p.out[0] = static_cast<T*>(y.raw_data());
    const AxpyFn<C> f{static_cast<C>(alpha)};
    if (x.is_contiguous()) {
      launch_map<T>(p, y.numel(), f);
    } else {
      launch_strided_map<T, 1, 1>(p, x.shape(), {&x.strides(), &y.strides()}, f, "axpy");
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(binary_forward, kCuda, binary_forward_cuda);
LOOM_REGISTER_KERNEL(scale_forward, kCuda, scale_forward_cuda);
LOOM_REGISTER_KERNEL(axpy, kCuda, axpy_cuda);

}  // namespace loom::kernels::cuda
