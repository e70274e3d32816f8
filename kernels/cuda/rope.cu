// kernels/cuda/rope.cu — CUDA rotary position embedding, forward and backward, with the
// contract of kernels/rope.h (Note [RoPE pairing]; the backward turns by the negative angle and
// accumulates into dx). A first kernel builds the (T, D/2) cos/sin table with the angles in
// double from the given frequencies, exactly as the CPU kernel does, rounded to the compute type
// (f32; f64 for f64); the second turns each (x_i, x_{i+D/2}) pair, 16 bytes of each half at a time
// when aligned. Dtypes f32, f64, bf16, f16 (16-bit floats computed in f32). Allocates only its
// table scratch; must not synchronise the host.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/row_io.cuh"
#include "kernels/rope.h"

namespace loom::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;  // both kernels' block (their __launch_bounds__)

// The frequencies as a kernel parameter (2 KiB: head dims up to 512).
constexpr int64_t kMaxHalf = 256;
struct InvFreq {
  double f[kMaxHalf];
};

// cs, sn (t_len, half): scale·cos and sign·scale·sin of positions[t] · f_i.
template <typename I, typename A>
__global__ void __launch_bounds__(kThreads)
    rope_table_kernel(const I* positions, int64_t t_len, int64_t half, InvFreq inv_freq,
                      double scale, double sign, A* cs, A* sn) {
  const int64_t n = t_len * half;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += step) {
    const int64_t t = idx / half, i = idx % half;
    const double a = static_cast<double>(positions[t]) * inv_freq.f[i];
    cs[idx] = static_cast<A>(scale * cos(a));
    sn[idx] = static_cast<A>(sign * scale * sin(a));
  }
}

// out (B, T, H, D) = (or +=) in (B, T, H, D) turned by the table's angles; W consecutive pairs
// per step (W = 1, or a 16-byte pack when half % W == 0 and the buffers are aligned).
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    rope_apply_kernel(const T* in, const AccT<T>* cs, const AccT<T>* sn, T* out, int64_t t_len,
                      int64_t heads, int64_t half, int64_t total, bool accumulate) {
  using A = AccT<T>;
  const int64_t hp = half / W;  // packs per half row
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += step) {
    const int64_t i = (idx % hp) * W;
    const int64_t bth = idx / hp;  // (b·T + t)·H + h
    const int64_t t = (bth / heads) % t_len;
    const int64_t base = bth * 2 * half + i;
    A x1[W], x2[W], c[W], s[W];
    load_pack<W>(in + base, x1);
    load_pack<W>(in + base + half, x2);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      c[k] = cs[t * half + i + k];
      s[k] = sn[t * half + i + k];
    }
    A y1[W], y2[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      y1[k] = x1[k] * c[k] - x2[k] * s[k];
      y2[k] = x2[k] * c[k] + x1[k] * s[k];
    }
    if (accumulate) {
      A o1[W], o2[W];
      load_pack<W>(out + base, o1);
      load_pack<W>(out + base + half, o2);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        y1[k] += o1[k];
        y2[k] += o2[k];
      }
    }
    store_pack<W>(out + base, y1);
    store_pack<W>(out + base + half, y2);
  }
}

void check_rope(const char* op, const Tensor& x, const Tensor& positions, const RopeFrequencies& f,
                const Tensor& out) {
  LOOM_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, op, ": x must be (B, T, H, D) with D even, got ",
             shape_str(x.shape()));
  LOOM_CHECK(out.shape() == x.shape() && out.dtype() == x.dtype(), op, ": output must match x");
  LOOM_CHECK(x.is_contiguous() && out.is_contiguous() && positions.is_contiguous(), op,
             ": tensors must be contiguous");
  LOOM_CHECK(positions.dim() == 1 && positions.size(0) == x.size(1), op, ": positions must be (",
             x.size(1), "), got ", shape_str(positions.shape()));
  LOOM_CHECK(static_cast<int64_t>(f.inv_freq.size()) == x.size(3) / 2, op, ": ", f.inv_freq.size(),
             " frequencies for head dim ", x.size(3));
  LOOM_CHECK(x.size(3) / 2 <= kMaxHalf, op, ": head dim ", x.size(3), " is above the ",
             2 * kMaxHalf, " the CUDA kernel takes");
}

template <typename T, int W>
void rope_apply_launch(const T* in, const AccT<T>* cs, const AccT<T>* sn, T* out, const Shape& s,
                       bool accumulate) {
  const int64_t half = s[3] / 2;
  const int64_t total = s[0] * s[1] * s[2] * (half / W);
  rope_apply_kernel<T, W><<<grid_for(total, kThreads), kThreads, 0, compute_stream()>>>(
      in, cs, sn, out, s[1], s[2], half, total, accumulate);
  LOOM_CUDA_LAUNCH_CHECK();
}

// Turns `in` by the angles of `positions` (sign +1) or back (sign −1) into `out`.
void rope_cuda(const char* op, const Tensor& in, const Tensor& positions, const RopeFrequencies& f,
               double sign, Tensor& out, bool accumulate) {
  check_rope(op, in, positions, f, out);
  const Shape& s = in.shape();
  const int64_t half = s[3] / 2;
  if (in.numel() == 0 || half == 0) return;
  CudaDeviceGuard guard(in.device().index);
  InvFreq inv_freq{};
  for (int64_t i = 0; i < half; ++i) inv_freq.f[i] = f.inv_freq[static_cast<size_t>(i)];
  LOOM_CUDA_DISPATCH_FLOAT(in.dtype(), op, [&] {
    using T = scalar_t;
    using A = AccT<T>;
    Tensor table = Tensor::empty({2, s[1], half}, DTypeOf<A>::value, in.device());
    A* cs = table.data<A>();
    A* sn = cs + s[1] * half;
    LOOM_DISPATCH_INDEX(positions.dtype(), op, [&] {
      rope_table_kernel<index_t, A>
          <<<grid_for(s[1] * half, kThreads), kThreads, 0, compute_stream()>>>(
              static_cast<const index_t*>(positions.raw_data()), s[1], half, inv_freq, f.scale,
              sign, cs, sn);
    });
    LOOM_CUDA_LAUNCH_CHECK();
    constexpr int kW = kPackWidth<T>;
    const auto* pin = static_cast<const T*>(in.raw_data());
    auto* pout = static_cast<T*>(out.raw_data());
    if (half % kW == 0 && aligned16({pin, pout})) {
      rope_apply_launch<T, kW>(pin, cs, sn, pout, s, accumulate);
    } else {
      rope_apply_launch<T, 1>(pin, cs, sn, pout, s, accumulate);
    }
  });
}

void rope_forward_cuda(const Tensor& x, const Tensor& positions, const RopeFrequencies& f,
                       Tensor& y) {
  rope_cuda("rope_forward", x, positions, f, 1.0, y, false);
}

void rope_backward_cuda(const Tensor& dy, const Tensor& positions, const RopeFrequencies& f,
                        Tensor& dx) {
  rope_cuda("rope_backward", dy, positions, f, -1.0, dx, true);
}

}  // namespace

LOOM_REGISTER_KERNEL(rope_forward, kCuda, rope_forward_cuda);
LOOM_REGISTER_KERNEL(rope_backward, kCuda, rope_backward_cuda);

}  // namespace loom::kernels::cuda
