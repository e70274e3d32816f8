// kernels/cuda/adamw.cu — CUDA AdamW (kernels/adamw.h): adamw_multi_step updates a list of
// parameters with one launch per kSlotsPerLaunch of them (gradients optionally scaled by a
// device scalar each thread reads once; with a device step count, the step's scalars derived
// from it by each thread and the count advanced by one more launch), and adamw_step is the
// list of one.
// f32 or f64 parameters and state (one dtype per call); optional bf16 copies of f32 parameters,
// rounded to nearest or stochastically (Note [bf16 stochastic rounding], Philox from
// core/philox.h).
//
// Note [Multi-tensor AdamW launch]: the host writes one AdamWSlot per non-empty parameter
// (pointers, size, its first chunk in the batch, decay factor, Philox counter) into an
// AdamWBatch passed BY VALUE as a kernel parameter (≤ 4 KB with the scalars), so there is no
// host→device copy and nothing that could synchronise the stream; one grid-stride kernel covers
// all chunks of kChunk elements of the batch, a block finding its chunk's parameter by binary
// search over the slots. Longer lists take one launch per kSlotsPerLaunch parameters. Every
// operation is rounded once, in the CPU kernel's order (no FMA contraction, IEEE sqrt and
// division); the CPU build may contract some into FMAs, so the two agree to about an ulp. Runs on
// the compute stream; must not synchronise the host.
#include <cmath>
#include <vector>

#include "core/philox.h"
#include "kernels/adamw.h"
#include "kernels/cuda/vec_map.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int64_t kChunk = 16384;   // elements of one block task; a multiple of every pack and 4
constexpr unsigned kThreads = 256;  // the kernel's block (its __launch_bounds__)

template <typename T>
struct AdamWSlot {
  T* p;
  const T* g;
  T* m;
  T* v;
  uint16_t* p16;        // bf16 copy bits, or null
  int64_t n;            // elements
  int64_t first_chunk;  // this parameter's first chunk in the batch
  uint64_t counter;     // Philox counter of element 0 (Note [bf16 stochastic rounding])
  T decay;              // 1 - lr · weight_decay
  int aligned;          // every pointer is pack-aligned
};

constexpr int kSlotsPerLaunch = 44;

template <typename T>
struct AdamWBatch {
  AdamWSlot<T> slot[kSlotsPerLaunch];
  int count;       // slots in use, >= 1
  int64_t chunks;  // chunks of all slots in use
};

template <typename T>
struct AdamWScalars {
  T b1, one_minus_b1, b2, one_minus_b2, step_size, inv_sqrt_bc2, eps;
  uint64_t seed;
  int stochastic;
  const double* grad_scale;  // a device scalar multiplying every gradient, or null
  // A device count of the updates made before (AdamWOptions::step_count), or null: each thread
  // then derives step_size and inv_sqrt_bc2 from it (lr, beta1, beta2) and skips the update when
  // grad_scale is not finite.
  const double* step_count;
  double lr, beta1, beta2;
};

__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

// One element, in the order of kernels/cpu/adamw.cpp.
template <typename T>
__device__ __forceinline__ void update(T& p, T g, T& m, T& v, T decay, const AdamWScalars<T>& s) {
  const T mi = add_rn(mul_rn(s.b1, m), mul_rn(s.one_minus_b1, g));
  const T vi = add_rn(mul_rn(s.b2, v), mul_rn(mul_rn(s.one_minus_b2, g), g));
  m = mi;
  v = vi;
  const T denom = add_rn(mul_rn(sqrt_rn(vi), s.inv_sqrt_bc2), s.eps);
  p = sub_rn(mul_rn(p, decay), div_rn(mul_rn(s.step_size, mi), denom));
}

__device__ __forceinline__ uint16_t bf16_copy_bits(float p, uint32_t random, int stochastic) {
  return stochastic ? bf16_bits_stochastic(__float_as_uint(p), random) : float_to_bf16_bits(p);
}

// Chunk c's parameter: the last slot whose first_chunk <= c.
template <typename T>
__device__ __forceinline__ int find_slot(const AdamWBatch<T>& b, int64_t c) {
  int lo = 0, hi = b.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (b.slot[mid].first_chunk <= c) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(__grid_constant__ const AdamWBatch<T> batch, const AdamWScalars<T> scalars) {
  constexpr int V = kPackOf<T>;
  using P = Pack<T, V>;
  const double factor = scalars.grad_scale != nullptr ? *scalars.grad_scale : 1.0;
  const T gs = static_cast<T>(factor);  // as scale_forward
  AdamWScalars<T> s = scalars;
  if (s.step_count != nullptr) {
    if (!isfinite(factor)) return;  // an overflowed step: skipped
    const AdamWStepScalars sc = adamw_step_scalars(s.lr, s.beta1, s.beta2, *s.step_count + 1.0);
    s.step_size = static_cast<T>(sc.step_size);
    s.inv_sqrt_bc2 = static_cast<T>(sc.inv_sqrt_bc2);
  }
  for (int64_t c = blockIdx.x; c < batch.chunks; c += gridDim.x) {
    const AdamWSlot<T> sl = batch.slot[find_slot(batch, c)];
    const int64_t begin = (c - sl.first_chunk) * kChunk;
    const int64_t end = begin + kChunk < sl.n ? begin + kChunk : sl.n;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * V; i < end;
         i += static_cast<int64_t>(blockDim.x) * V) {
      T p[V], g[V], m[V], v[V];
      const bool full = sl.aligned && i + V <= end;
      if (full) {
        const P pp = *reinterpret_cast<const P*>(sl.p + i),
                pg = *reinterpret_cast<const P*>(sl.g + i);
        const P pm = *reinterpret_cast<const P*>(sl.m + i),
                pv = *reinterpret_cast<const P*>(sl.v + i);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          p[j] = pp.v[j];
          g[j] = pg.v[j];
          m[j] = pm.v[j];
          v[j] = pv.v[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const bool in = i + j < end;
          p[j] = in ? sl.p[i + j] : T(0);
          g[j] = in ? sl.g[i + j] : T(0);
          m[j] = in ? sl.m[i + j] : T(0);
          v[j] = in ? sl.v[i + j] : T(0);
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) update(p[j], mul_rn(gs, g[j]), m[j], v[j], sl.decay, s);
      if (full) {
        P pp, pm, pv;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          pp.v[j] = p[j];
          pm.v[j] = m[j];
          pv.v[j] = v[j];
        }
        *reinterpret_cast<P*>(sl.p + i) = pp;
        *reinterpret_cast<P*>(sl.m + i) = pm;
        *reinterpret_cast<P*>(sl.v + i) = pv;
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (i + j < end) {
            sl.p[i + j] = p[j];
            sl.m[i + j] = m[j];
            sl.v[i + j] = v[j];
          }
        }
      }
      if constexpr (std::is_same_v<T, float>) {
        if (sl.p16 != nullptr) {
          // i is a multiple of 4 (chunks and packs are), so one Philox block serves the pack.
          const Philox4 r = philox4x32(sl.counter + static_cast<uint64_t>(i) / 4, s.seed);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            if (i + j < end) sl.p16[i + j] = bf16_copy_bits(p[j], r.v[j], s.stochastic);
          }
        }
      }
    }
  }
}

void check_entry(const AdamWParam& e, const AdamWParam& first, int64_t step) {
  LOOM_CHECK(step >= 1, "adamw_step: step must be >= 1, got ", step);
  check_same_contiguous("adamw_step", e.param, {&e.grad, &e.exp_avg, &e.exp_avg_sq});
  LOOM_CHECK(e.param.device() == first.param.device() && e.param.dtype() == first.param.dtype(),
             "adamw_multi_step: cuda kernel needs one device and one dtype, got ",
             e.param.device().str(), " ", dtype_name(e.param.dtype()), " and ",
             first.param.device().str(), " ", dtype_name(first.param.dtype()));
  if (e.param_bf16.defined()) {
    LOOM_CHECK(e.param.dtype() == DType::kF32 && e.param_bf16.dtype() == DType::kBF16 &&
                   e.param_bf16.shape() == e.param.shape() && e.param_bf16.is_contiguous() &&
                   e.param_bf16.device() == e.param.device(),
               "adamw_multi_step: a bf16 copy needs an f32 parameter and a contiguous bf16 "
               "tensor of its shape on its device");
  }
}

template <typename T>
bool slot_aligned(const AdamWSlot<T>& s) {
  constexpr uintptr_t kBytes = sizeof(Pack<T, kPackOf<T>>);
  for (const void* q : {static_cast<const void*>(s.p), static_cast<const void*>(s.g),
                        static_cast<const void*>(s.m), static_cast<const void*>(s.v)}) {
    if (reinterpret_cast<uintptr_t>(q) % kBytes != 0) return false;
  }
  return true;
}

// Advances AdamWOptions::step_count after the update, when it was made.
__global__ void __launch_bounds__(32)
    advance_step_count_kernel(double* count, const double* grad_scale) {
  if (threadIdx.x == 0 && (grad_scale == nullptr || isfinite(*grad_scale))) *count += 1.0;
}

template <typename T>
AdamWScalars<T> scalars_for(const AdamWOptions& o) {
  const AdamWStepScalars sc =
      adamw_step_scalars(o.lr, o.beta1, o.beta2, static_cast<double>(o.step));
  AdamWScalars<T> s{};
  s.b1 = static_cast<T>(o.beta1);
  s.one_minus_b1 = static_cast<T>(1.0 - o.beta1);
  s.b2 = static_cast<T>(o.beta2);
  s.one_minus_b2 = static_cast<T>(1.0 - o.beta2);
  s.step_size = static_cast<T>(sc.step_size);
  s.inv_sqrt_bc2 = static_cast<T>(sc.inv_sqrt_bc2);
  s.eps = static_cast<T>(o.eps);
  s.seed = o.seed;
  s.stochastic = o.stochastic_rounding ? 1 : 0;
  s.grad_scale = o.grad_scale.defined() ? o.grad_scale.data<double>() : nullptr;
  s.step_count = o.step_count.defined() ? o.step_count.data<double>() : nullptr;
  s.lr = o.lr;
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  return s;
}

template <typename T>
void launch_batch(const AdamWBatch<T>& b, const AdamWScalars<T>& s) {
  static_assert(sizeof(AdamWBatch<T>) + sizeof(AdamWScalars<T>) <= 4096,
                "kernel parameters stay within 4 KB");
  adamw_multi_kernel<T><<<grid_for(b.chunks, 1), kThreads, 0, compute_stream()>>>(b, s);
  LOOM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void launch_multi(const std::vector<AdamWParam>& params, const AdamWOptions& o) {
  const AdamWScalars<T> s = scalars_for<T>(o);
  AdamWBatch<T> b{};
  uint64_t counter = o.offset;
  for (const AdamWParam& e : params) {
    const int64_t n = e.param.numel();
    if (n > 0) {
      AdamWSlot<T>& sl = b.slot[b.count];
      sl.p = static_cast<T*>(e.param.raw_data());
      sl.g = static_cast<const T*>(e.grad.raw_data());
      sl.m = static_cast<T*>(e.exp_avg.raw_data());
      sl.v = static_cast<T*>(e.exp_avg_sq.raw_data());
      sl.p16 = e.param_bf16.defined() ? static_cast<uint16_t*>(e.param_bf16.raw_data()) : nullptr;
      sl.n = n;
      sl.first_chunk = b.chunks;
      sl.counter = counter;
      sl.decay = static_cast<T>(1.0 - o.lr * e.weight_decay);
      sl.aligned = slot_aligned(sl) ? 1 : 0;
      b.chunks += (n + kChunk - 1) / kChunk;
      if (++b.count == kSlotsPerLaunch) {
        launch_batch(b, s);
        b = AdamWBatch<T>{};
      }
    }
    counter += static_cast<uint64_t>((n + 3) / 4);
  }
  if (b.count > 0) launch_batch(b, s);
}

void adamw_multi_step_cuda(const std::vector<AdamWParam>& params, const AdamWOptions& o) {
  if (params.empty()) return;
  for (const AdamWParam& e : params) check_entry(e, params.front(), o.step);
  LOOM_CHECK(!o.grad_scale.defined() ||
                 (o.grad_scale.numel() == 1 && o.grad_scale.dtype() == DType::kF64 &&
                  o.grad_scale.device() == params.front().param.device()),
             "adamw_multi_step: grad_scale must be one f64 element on the parameters' device");
  LOOM_CHECK(!o.step_count.defined() ||
                 (o.step_count.numel() == 1 && o.step_count.dtype() == DType::kF64 &&
                  o.step_count.device() == params.front().param.device()),
             "adamw_multi_step: step_count must be one f64 element on the parameters' device");
  CudaDeviceGuard guard(params.front().param.device().index);
  switch (params.front().param.dtype()) {
    case DType::kF32:
      launch_multi<float>(params, o);
      break;
    case DType::kF64:
      launch_multi<double>(params, o);
      break;
    default:
      LOOM_FAIL("adamw_multi_step: dtype ", dtype_name(params.front().param.dtype()),
                " not supported on cuda (f32, f64)");
  }
  if (o.step_count.defined()) {  // after every batch has read the count
    advance_step_count_kernel<<<1, 32, 0, compute_stream()>>>(
        o.step_count.data<double>(),
        o.grad_scale.defined() ? o.grad_scale.data<double>() : nullptr);
    LOOM_CUDA_LAUNCH_CHECK();
  }
}

void adamw_step_cuda(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                     double lr, double beta1, double beta2, double eps, double weight_decay,
                     int64_t step) {
  AdamWOptions o;
  o.lr = lr;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.step = step;
  adamw_multi_step_cuda({AdamWParam{param, grad, exp_avg, exp_avg_sq, weight_decay, Tensor()}}, o);
}

}  // namespace

LOOM_REGISTER_KERNEL(adamw_step, kCuda, adamw_step_cuda);
LOOM_REGISTER_KERNEL(adamw_multi_step, kCuda, adamw_multi_step_cuda);

}  // namespace loom::kernels::cuda
