// kernels/cuda/dropout.cu — CUDA inverted dropout, forward and backward, with the mask of
// Note [Dropout mask] (kernels/dropout.h) regenerated from Philox (core/philox.h): the same keep
// decision as the CPU kernel for every (seed, offset, i), bit for bit. One Philox block serves
// four consecutive elements (packs hold a multiple of four). Products are rounded once (no FMA),
// so f32/f64 results equal the CPU's; bf16/f16 use an f32 scale. Contiguous tensors only. Runs
// on the compute stream; must not synchronise the host. The rows form (sequence/context
// parallelism) maps local element (b, j, c) to the full tensor's element (b·T + rows[j])·C + c
// with rows on the device; when C is a multiple of 4 a Philox block still serves four
// consecutive elements, else each element draws its own block. Row values are not checked here
// (that would read them back); the CPU kernel checks them.
#include "core/philox.h"
#include "kernels/cuda/vec_map.cuh"
#include "kernels/dropout.h"

namespace loom::kernels::cuda {
namespace {

// Elements per pack: 16 bytes, and at least one Philox block (4 elements).
template <typename T>
inline constexpr int kDropoutPack = kPackOf<T> > 4 ? kPackOf<T> : 4;

// y[b + l] (=, or += when Accumulate) keep ? x[b + l]·scale : 0 for l < 4, from the four draws
// `bits` (one Philox block's, or four elements' own).
template <bool Accumulate, typename C, int V>
__device__ __forceinline__ void apply_four(const uint32_t (&bits)[4], float p, C scale,
                                           const C (&x)[V], C (&y)[V], int b) {
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    const bool keep = uint_to_unit_float(bits[l]) > p;
    const C v = keep ? mul_rn(x[b + l], scale) : C(0);
    if constexpr (Accumulate) {
      y[b + l] = add_rn(y[b + l], v);
    } else {
      y[b + l] = v;
    }
  }
}

// y (=, or += when Accumulate) keep(i) ? x·scale : 0
template <bool Accumulate, typename C>
struct DropoutFn {
  static constexpr bool kReadsOut = Accumulate;
  uint64_t seed, offset;
  float p;
  C scale;
  template <int V>
  __device__ void apply(int64_t first, C (&x)[1][V], C (&y)[1][V]) const {
    static_assert(V % 4 == 0, "a pack covers whole Philox blocks");
#pragma unroll
    for (int b = 0; b < V; b += 4) {
      // first is a multiple of V, so element first + b is lane 0 of its Philox block.
      const Philox4 r = philox4x32(offset + static_cast<uint64_t>(first + b) / 4, seed);
      apply_four<Accumulate>(r.v, p, scale, x[0], y[0], b);
    }
  }
};

// The rows form: element e = first + l of the local (B, R, C) tensor is element
// ((b0 + b)·T + rows[j])·C + c of the full one (Note [Dropout mask], rows form).
template <bool Accumulate, typename C>
struct DropoutRowsFn {
  static constexpr bool kReadsOut = Accumulate;
  const int64_t* rows;
  int64_t R, Cn, T, b0;
  uint64_t seed, offset;
  float p;
  C scale;
  __device__ uint64_t global_index(int64_t e) const {
    const int64_t c = e % Cn, r = e / Cn;
    return static_cast<uint64_t>(((b0 + r / R) * T + rows[r % R]) * Cn + c);
  }
  template <int V>
  __device__ void apply(int64_t first, C (&x)[1][V], C (&y)[1][V]) const {
    static_assert(V % 4 == 0, "a pack covers whole Philox blocks");
#pragma unroll
    for (int b = 0; b < V; b += 4) {
      uint32_t bits[4];
      if (Cn % 4 == 0) {
        // first + b is a multiple of 4, so its four elements share a row and a Philox block.
        const Philox4 r = philox4x32(offset + global_index(first + b) / 4, seed);
#pragma unroll
        for (int l = 0; l < 4; ++l) bits[l] = r.v[l];
      } else {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const uint64_t g = global_index(first + b + l);
          bits[l] = philox4x32(offset + g / 4, seed).v[g % 4];
        }
      }
      apply_four<Accumulate>(bits, p, scale, x[0], y[0], b);
    }
  }
};

// in → out (contiguous, one shape) through the functor make(C{}) builds for the compute type C,
// after the checks every form shares.
template <typename Make>
void launch_dropout(const char* op, const Tensor& in, double p, Tensor& out, Make make) {
  check_same_contiguous(op, in, {&out});
  LOOM_CHECK(p >= 0 && p <= 1, op, ": p must be in [0, 1], got ", p);
  if (in.numel() == 0) return;
  CudaDeviceGuard guard(out.device().index);
  LOOM_CUDA_DISPATCH_FLOAT(in.dtype(), op, [&] {
    using T = scalar_t;
    MapPtrs<1, 1, T> ptrs;
    ptrs.in[0] = static_cast<const T*>(in.raw_data());
    ptrs.out[0] = static_cast<T*>(out.raw_data());
    launch_map<T, kDropoutPack<T>>(ptrs, in.numel(), make(compute_t<T>{}));
  });
}

template <bool Accumulate>
void dropout_apply(const char* op, const Tensor& in, double p, uint64_t seed, uint64_t offset,
                   Tensor& out) {
  launch_dropout(op, in, p, out, [&](auto c) {
    using C = decltype(c);
    return DropoutFn<Accumulate, C>{seed, offset, static_cast<float>(p),
                                    static_cast<C>(1.0 / (1.0 - p))};
  });
}

template <bool Accumulate>
void dropout_rows_apply(const char* op, const Tensor& in, const Tensor& rows, int64_t total,
                        int64_t b0, double p, uint64_t seed, uint64_t offset, Tensor& out) {
  LOOM_CHECK(in.dim() == 3, op, ": x must be (B, R, C), got ", shape_str(in.shape()));
  LOOM_CHECK(rows.dtype() == DType::kI64 && rows.dim() == 1 && rows.size(0) == in.size(1) &&
                 rows.is_contiguous() && rows.device() == in.device(),
             op, ": rows must be (", in.size(1), ") contiguous i64 on ", in.device().str(),
             ", got ", shape_str(rows.shape()), " ", dtype_name(rows.dtype()));
  LOOM_CHECK(total > 0 && b0 >= 0, op,
             ": total rows must be positive and the batch offset non-negative, got ", total,
             " and ", b0);
  launch_dropout(op, in, p, out, [&](auto c) {
    using C = decltype(c);
    return DropoutRowsFn<Accumulate, C>{static_cast<const int64_t*>(rows.raw_data()),
                                        in.size(1),
                                        in.size(2),
                                        total,
                                        b0,
                                        seed,
                                        offset,
                                        static_cast<float>(p),
                                        static_cast<C>(1.0 / (1.0 - p))};
  });
}

void dropout_forward_cuda(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& y) {
  dropout_apply<false>("dropout_forward", x, p, seed, offset, y);
}

void dropout_backward_cuda(const Tensor& dy, double p, uint64_t seed, uint64_t offset, Tensor& dx) {
  dropout_apply<true>("dropout_backward", dy, p, seed, offset, dx);
}

void dropout_rows_forward_cuda(const Tensor& x, const Tensor& rows, int64_t total, int64_t b0,
                               double p, uint64_t seed, uint64_t offset, Tensor& y) {
  dropout_rows_apply<false>("dropout_rows_forward", x, rows, total, b0, p, seed, offset, y);
}

void dropout_rows_backward_cuda(const Tensor& dy, const Tensor& rows, int64_t total, int64_t b0,
                                double p, uint64_t seed, uint64_t offset, Tensor& dx) {
  dropout_rows_apply<true>("dropout_rows_backward", dy, rows, total, b0, p, seed, offset, dx);
}

}  // namespace

LOOM_REGISTER_KERNEL(dropout_forward, kCuda, dropout_forward_cuda);
LOOM_REGISTER_KERNEL(dropout_backward, kCuda, dropout_backward_cuda);
LOOM_REGISTER_KERNEL(dropout_rows_forward, kCuda, dropout_rows_forward_cuda);
LOOM_REGISTER_KERNEL(dropout_rows_backward, kCuda, dropout_rows_backward_cuda);

}  // namespace loom::kernels::cuda
