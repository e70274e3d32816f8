// kernels/cuda/matmul.cu — CUDA GEMM (kernels/matmul.h) through cuBLASLt, and the fused
// bias / bias+GELU forward and GELU+bias-gradient backward forms through its epilogues (each with
// an unfused fallback). Row-major Loom matrices are handed to the
// column-major library as their transposes (Note [Row-major through cuBLASLt]). f64, and
// layouts cuBLASLt has no algorithm for, go through cuBLAS (GemmStridedBatchedEx). Everything
// runs on compute_stream(); nothing here synchronises the host or allocates device memory after
// the first call on a thread, except the unfused 16-bit epilogues' f32 scratch (Note [Unfused
// epilogues]), taken from the caching allocator.
//
// Note [GEMM plans]: a plan (matmul descriptor, three layouts, the algorithm the heuristic
// chose) is built once per shape key — dtypes, compute type, flags, sizes, leading dims,
// batch strides, epilogue and the pointers' alignments — and kept in a small thread_local map,
// so a training step runs no heuristic query after its first iteration. A key the heuristic
// has no algorithm for is remembered too (epilogues then take the unfused path).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>

#include "kernels/copy.h"
#include "kernels/cuda/cublaslt_handle.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/dtype_convert.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/vec_map.cuh"  // LOOM_CUDA_DISPATCH_FLOAT
#include "kernels/matmul.h"
#include "kernels/reduce.h"

namespace loom::kernels::cuda {
namespace {

// Note [Row-major through cuBLASLt]: a row-major (R, C) matrix with row stride ld is, read
// column-major, the (C, R) matrix with leading dim ld — its transpose. So c = op(a)·op(b)
// (row-major) is computed as cᵀ = op(b)ᵀ·op(a)ᵀ (column-major): the library's A is our b with
// our trans_b, its B is our a with our trans_a, its (m, n) is our (N, M), and a bias of length
// N (one per library row) broadcasts over our rows.
struct Operand {
  const void* ptr;
  int64_t rows, cols, ld;  // column-major view: rows = our size(-1), cols = our size(-2)
  int64_t batch_stride;
};

Operand operand(const Tensor& t, bool batched, const char* what) {
  const int64_t r = t.size(-2), c = t.size(-1);
  if (t.numel() == 0) return {t.raw_data(), c, r, std::max<int64_t>(c, 1), 0};  // never read
  LOOM_CHECK(t.stride(-1) == 1 || c == 1, "gemm: ", what, " needs unit stride in its last dim");
  // A single row may carry any row stride; the library needs ld >= its row count.
  const int64_t ld =
      (r == 1) ? std::max<int64_t>(t.stride(-2), std::max<int64_t>(c, 1)) : t.stride(-2);
  LOOM_CHECK(ld >= std::max<int64_t>(c, 1), "gemm: ", what, " row stride ", t.stride(-2),
             " is smaller than its row length ", c);
  return {t.raw_data(), c, r, ld, batched ? t.stride(0) : 0};
}

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF64:
      return CUDA_R_64F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      LOOM_FAIL("gemm: dtype ", dtype_name(dt), " not supported on cuda");
  }
}

// The largest power of two (up to 256) dividing the address and, for batched operands, the
// batch stride in bytes (so every batch's matrix has it): what the heuristic may assume.
uint32_t alignment_of(const void* p, int64_t batch_stride_bytes = 0) {
  const auto v = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) |
                 static_cast<uint64_t>(batch_stride_bytes);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

// One GEMM as the library sees it (Note [Row-major through cuBLASLt]).
struct LtGemm {
  Operand a, b;  // the library's A (our b) and B (our a)
  bool trans_a, trans_b;
  void* d;
  int64_t m, n, k, batch;  // library sizes: m = our N, n = our M
  DType in_dtype, out_dtype;
  cublasComputeType_t compute;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  // The bias (BIAS, GELU_AUX_BIAS: read) or the bias gradient (DGELU_BGRAD: written), length m.
  const void* bias = nullptr;
  // The GELU input (pre-activation), ld m, of out_dtype: written by GELU_AUX_BIAS, read by
  // DGELU_BGRAD.
  const void* aux = nullptr;

  uint32_t align_a() const { return alignment_of(a.ptr, batch_bytes(a.batch_stride, in_dtype)); }
  uint32_t align_b() const { return alignment_of(b.ptr, batch_bytes(b.batch_stride, in_dtype)); }
  uint32_t align_d() const { return alignment_of(d, batch_bytes(m * n, out_dtype)); }
  int64_t batch_bytes(int64_t stride, DType dt) const {
    return batch > 1 ? stride * static_cast<int64_t>(dtype_size(dt)) : 0;
  }
};

using PlanKey = std::array<int64_t, 20>;

PlanKey plan_key(const LtGemm& g, int device) {
  return {device,
          static_cast<int64_t>(g.in_dtype),
          static_cast<int64_t>(g.out_dtype),
          g.compute,
          g.trans_a,
          g.trans_b,
          g.m,
          g.n,
          g.k,
          g.batch,
          g.a.ld,
          g.b.ld,
          g.a.batch_stride,
          g.b.batch_stride,
          g.epilogue,
          g.align_a(),
          g.align_b(),
          g.align_d(),
          alignment_of(g.bias),
          alignment_of(g.aux)};
}

// A cached plan (Note [GEMM plans]); owns its descriptors.
class Plan {
 public:
  Plan() = default;
  ~Plan() {
    for (cublasLtMatrixLayout_t l : {a_, b_, d_}) {
      if (l != nullptr) (void)cublasLtMatrixLayoutDestroy(l);
    }
    if (desc_ != nullptr) (void)cublasLtMatmulDescDestroy(desc_);
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Builds the descriptors and asks the heuristic once. False when it has no algorithm.
  bool build(const LtGemm& g, BlasContext& ctx) {
    const cudaDataType_t scale = CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, g.compute, scale));
    const int32_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_desc(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    set_desc(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    const uint32_t epi = g.epilogue;
    set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
    if (g.aux != nullptr) {
      const int64_t aux_ld = g.m;
      set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
    }
    set_pointers(g);
    a_ = layout(cuda_type(g.in_dtype), g.a, g.batch);
    b_ = layout(cuda_type(g.in_dtype), g.b, g.batch);
    d_ = layout(cuda_type(g.out_dtype), Operand{g.d, g.m, g.n, g.m, g.m * g.n}, g.batch);

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = BlasContext::kWorkspaceBytes;
    const uint32_t al_a = g.align_a(), al_b = g.align_b(), al_d = g.align_d();
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> prefs[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d}};
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof(ws));
    for (const auto& [attr, value] : prefs) {
      if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulPreferenceSetAttribute(pref, attr, value, sizeof(uint32_t));
      }
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st =
          cublasLtMatmulAlgoGetHeuristic(ctx.lt(), desc_, a_, b_, d_, d_, pref, 1, &result, &found);
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    // The library answers NOT_SUPPORTED or INVALID_VALUE for a combination it lacks (e.g. an
    // epilogue for these dtypes): the caller then takes the unfused or cuBLAS path.
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
        (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
      return false;
    }
    CUBLAS_CHECK(st);
    algo_ = result.algo;
    return true;
  }

  // Runs the plan on g's pointers (same key as at build time); false (nothing launched, the
  // plan unusable from then on) when the library refuses the algorithm the heuristic gave
  // (NOT_SUPPORTED or INVALID_VALUE at run time): the caller then takes another path.
  bool run(const LtGemm& g, BlasContext& ctx, float alpha, float beta) {
    set_pointers(g);
    const cublasStatus_t st =
        cublasLtMatmul(ctx.lt(), desc_, &alpha, g.a.ptr, a_, g.b.ptr, b_, &beta, g.d, d_, g.d, d_,
                       &algo_, ctx.workspace(), BlasContext::kWorkspaceBytes, compute_stream());
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
      usable_ = false;
      return false;
    }
    CUBLAS_CHECK(st);
    return true;
  }
  bool usable() const { return usable_; }

 private:
  void set_desc(cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attr, value, size));
  }
  void set_pointers(const LtGemm& g) {
    if (g.bias != nullptr) set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias));
    if (g.aux != nullptr)
      set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux));
  }
  static cublasLtMatrixLayout_t layout(cudaDataType_t type, const Operand& op, int64_t batch) {
    cublasLtMatrixLayout_t l = nullptr;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(op.rows),
                                            static_cast<uint64_t>(op.cols), op.ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t stride = op.batch_stride;
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                    sizeof(count)));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                    &stride, sizeof(stride)));
    }
    return l;
  }

  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool usable_ = true;  // false once the library refused algo_ at run time
};

// The plan for g, built on first use; null when the library has no algorithm for it (or
// refused the one it gave when run).
Plan* find_plan(const LtGemm& g, int device, BlasContext& ctx) {
  constexpr size_t kMaxPlans = 512;  // a model has a few dozen shapes; this only bounds misuse
  thread_local std::map<PlanKey, std::unique_ptr<Plan>> plans;
  const PlanKey key = plan_key(g, device);
  auto it = plans.find(key);
  if (it == plans.end()) {
    if (plans.size() >= kMaxPlans) plans.clear();
    auto plan = std::make_unique<Plan>();
    if (!plan->build(g, ctx)) plan.reset();
    it = plans.emplace(key, std::move(plan)).first;
  }
  return it->second && it->second->usable() ? it->second.get() : nullptr;
}

// g through cuBLAS (cublasGemmStridedBatchedEx): f64 always, other dtypes when cuBLASLt has no
// algorithm for a layout (e.g. 2-byte-aligned bf16 views). Same compute type as the Lt path.
void gemm_cublas(BlasContext& ctx, const LtGemm& g, double alpha, double beta) {
  const bool f64 = g.in_dtype == DType::kF64;
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const void* pa = f64 ? static_cast<const void*>(&alpha) : &alpha_f;
  const void* pb = f64 ? static_cast<const void*>(&beta) : &beta_f;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
      ctx.blas(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m,
      g.n, g.k, pa, g.a.ptr, cuda_type(g.in_dtype), g.a.ld, g.a.batch_stride, g.b.ptr,
      cuda_type(g.in_dtype), g.b.ld, g.b.batch_stride, pb, g.d, cuda_type(g.out_dtype), g.m,
      g.m * g.n, g.batch, g.compute, CUBLAS_GEMM_DEFAULT));
}

// ---- element-wise helpers: k == 0, and the unfused epilogues ----

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr unsigned kThreads = 256;  // the helpers' block (their __launch_bounds__)

// c (n) ← beta·c, with beta == 0 writing zeros (c is not read, as in BLAS).
template <typename T>
__global__ void __launch_bounds__(kThreads) gemm_scale_kernel(T* c, int64_t n, double beta) {
  using A = acc_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    c[i] = beta == 0.0 ? convert<T>(A(0)) : convert<T>(convert<A>(c[i]) * static_cast<A>(beta));
  }
}

// Note [Unfused epilogues]: where the fused cuBLASLt epilogue cannot run (an aux ld that is not a
// multiple of 8, no algorithm), the product goes to an accumulator of acc_t<T> (f32 for bf16/f16:
// an f32 scratch from the caching allocator; the output itself for f32/f64), and one kernel adds
// the bias, applies GELU or its derivative to the unrounded value and rounds once — as the fused
// epilogue does. Rounding the product to 16 bits first and applying GELU to the rounded value
// made the two paths differ by more than the 16-bit tolerance on the first GPU run (a 1×1 GELU in
// GELU's negative tail, a bias gradient summed from rounded products).

// pre (m, n) = acc + bias (n) per row, rounded once; with kGelu also out (m, n) = gelu of the
// unrounded sum. acc may be pre itself (f32/f64).
template <typename T, bool kGelu>
__global__ void __launch_bounds__(kThreads)
    bias_epilogue_kernel(const acc_t<T>* acc, T* pre, T* out, const T* bias, int64_t m, int64_t n) {
  using A = acc_t<T>;
  const int64_t total = m * n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const A v = acc[i] + convert<A>(bias[i % n]);
    pre[i] = convert<T>(v);
    if constexpr (kGelu) out[i] = convert<T>(gelu_value(v));  // gelu.cuh
  }
}

// dpre (m, n) = acc · gelu'(pre), rounded once; acc keeps the unrounded product for the bias
// gradient (acc may be dpre itself for f32/f64).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dgelu_epilogue_kernel(acc_t<T>* acc, const T* pre, T* dpre, int64_t total) {
  using A = acc_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const A v = acc[i] * gelu_grad(convert<A>(pre[i]));
    acc[i] = v;
    dpre[i] = convert<T>(v);
  }
}

// The library-side description of c = op(a)·op(b) (Note [Row-major through cuBLASLt]).
LtGemm describe(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
                const char* name) {
  LOOM_CHECK((c.dim() == 2 || c.dim() == 3) && a.dim() == c.dim() && b.dim() == c.dim(), name,
             ": operands must all be 2-d or all 3-d");
  LOOM_CHECK(c.is_contiguous(), name, ": c must be contiguous");
  LOOM_CHECK(a.dtype() == b.dtype(), name, ": a and b have different dtypes");
  const bool batched = c.dim() == 3;
  const int64_t batch = batched ? c.size(0) : 1;
  LOOM_CHECK(!batched || (a.size(0) == batch && b.size(0) == batch), name, ": batch sizes differ");
  const int64_t m = c.size(-2), n = c.size(-1);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  LOOM_CHECK((trans_a ? a.size(-1) : a.size(-2)) == m && (trans_b ? b.size(-1) : b.size(-2)) == k &&
                 (trans_b ? b.size(-2) : b.size(-1)) == n,
             name, ": shapes ", shape_str(a.shape()), ", ", shape_str(b.shape()), " → ",
             shape_str(c.shape()), " do not match the flags");
  const bool half_in = a.dtype() == DType::kBF16 || a.dtype() == DType::kF16;
  LOOM_CHECK(c.dtype() == a.dtype() || (half_in && c.dtype() == DType::kF32), name, ": c dtype ",
             dtype_name(c.dtype()), " does not go with inputs of ", dtype_name(a.dtype()));
  LtGemm g{operand(b, batched, "b"),
           operand(a, batched, "a"),
           trans_b,
           trans_a,
           c.raw_data(),
           n,
           m,
           k,
           batch,
           a.dtype(),
           c.dtype(),
           CUBLAS_COMPUTE_32F};
  if (a.dtype() == DType::kF32 && tf32_allowed()) g.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  if (a.dtype() == DType::kF64) g.compute = CUBLAS_COMPUTE_64F;
  return g;
}

// Runs g (no epilogue) with the given scalars; the caller holds the device guard.
void run_gemm(const LtGemm& g, int device, double alpha, double beta, const char* name) {
  const int64_t total = g.m * g.n * g.batch;
  if (total == 0) return;
  if (g.k == 0) {
    LOOM_DISPATCH_ALL(g.out_dtype, name, [&] {
      gemm_scale_kernel<scalar_t><<<grid_for(total, kThreads), kThreads, 0, compute_stream()>>>(
          static_cast<scalar_t*>(g.d), total, beta);
    });
    LOOM_CUDA_LAUNCH_CHECK();
    return;
  }
  BlasContext& ctx = blas_context(device);
  Plan* plan = g.in_dtype == DType::kF64 ? nullptr : find_plan(g, device, ctx);
  if (plan == nullptr || !plan->run(g, ctx, static_cast<float>(alpha), static_cast<float>(beta))) {
    gemm_cublas(ctx, g, alpha, beta);
  }
}

void gemm_cuda(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
               double alpha, double beta) {
  CudaDeviceGuard guard(c.device().index);
  const LtGemm g = describe(a, b, c, trans_a, trans_b, "gemm");
  run_gemm(g, c.device().index, alpha, beta, "gemm");
}

bool is_half_dtype(DType dt) { return dt == DType::kBF16 || dt == DType::kF16; }

// Tries the fused epilogue (16-bit inputs only: for f32/f64 the unfused path keeps the CPU's
// accuracy); true when it ran. bias is the bias (or, for DGELU_BGRAD, the bias gradient) vector
// of length g.m, of g.out_dtype; aux the GELU input matrix (ld g.m, g.out_dtype) or null.
bool try_fused(LtGemm g, int device, cublasLtEpilogue_t epilogue, const void* bias,
               const void* aux) {
  if (!is_half_dtype(g.in_dtype)) return false;
  if (g.k == 0 || g.m * g.n == 0) return false;
  if (aux != nullptr && g.m % 8 != 0) return false;  // the aux ld must be a multiple of 8
  g.epilogue = epilogue;
  g.bias = bias;
  g.aux = aux;
  BlasContext& ctx = blas_context(device);
  Plan* plan = find_plan(g, device, ctx);
  return plan != nullptr && plan->run(g, ctx, 1.0f, 0.0f);
}

void check_bias(const Tensor& bias, const Tensor& c, const char* name) {
  LOOM_CHECK(c.dim() == 2, name, ": operands must be 2-d");
  LOOM_CHECK(bias.dim() == 1 && bias.size(0) == c.size(1) && bias.is_contiguous() &&
                 bias.dtype() == c.dtype(),
             name, ": bias must be contiguous (", c.size(1), ") ", dtype_name(c.dtype()), ", got ",
             shape_str(bias.shape()), " ", dtype_name(bias.dtype()));
}

// The accumulator of an unfused epilogue (Note [Unfused epilogues]): an f32 scratch shaped like
// out for 16-bit outputs, else out itself.
Tensor epilogue_accumulator(const Tensor& out) {
  return is_half_dtype(out.dtype()) ? Tensor::empty(out.shape(), DType::kF32, out.device()) : out;
}

// The GEMM of g into acc (the accumulator above) instead of g's own output.
void run_gemm_into(LtGemm g, Tensor& acc, int device, const char* name) {
  g.d = acc.raw_data();
  g.out_dtype = acc.dtype();
  run_gemm(g, device, 1.0, 0.0, name);
}

// The unfused bias epilogue: pre = acc + bias per row (and out = gelu of it when out is given).
void launch_bias_epilogue(const Tensor& acc, Tensor& pre, Tensor* out, const Tensor& bias,
                          const char* name) {
  const int64_t m = pre.size(0), n = pre.size(1);
  if (m * n == 0) return;
  LOOM_DISPATCH_ALL(pre.dtype(), name, [&] {
    if constexpr (std::is_floating_point_v<scalar_t> || kIsHalf<scalar_t>) {
      using A = acc_t<scalar_t>;
      const A* a = static_cast<const A*>(acc.raw_data());
      scalar_t* p = static_cast<scalar_t*>(pre.raw_data());
      const scalar_t* bs = static_cast<const scalar_t*>(bias.raw_data());
      const unsigned blocks = grid_for(m * n, kThreads);
      if (out != nullptr) {
        bias_epilogue_kernel<scalar_t, true><<<blocks, kThreads, 0, compute_stream()>>>(
            a, p, static_cast<scalar_t*>(out->raw_data()), bs, m, n);
      } else {
        bias_epilogue_kernel<scalar_t, false>
            <<<blocks, kThreads, 0, compute_stream()>>>(a, p, p, bs, m, n);
      }
    } else {
      LOOM_FAIL(name, ": dtype ", dtype_name(pre.dtype()), " not supported");
    }
  });
  LOOM_CUDA_LAUNCH_CHECK();
}

void gemm_bias_cuda(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c, bool trans_a,
                    bool trans_b) {
  CudaDeviceGuard guard(c.device().index);
  const int device = c.device().index;
  check_bias(bias, c, "gemm_bias");
  const LtGemm g = describe(a, b, c, trans_a, trans_b, "gemm_bias");
  if (try_fused(g, device, CUBLASLT_EPILOGUE_BIAS, bias.raw_data(), nullptr)) return;
  Tensor acc = epilogue_accumulator(c);
  run_gemm_into(g, acc, device, "gemm_bias");
  launch_bias_epilogue(acc, c, nullptr, bias, "gemm_bias");
}

void gemm_bias_gelu_cuda(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& pre,
                         Tensor& c, bool trans_a, bool trans_b) {
  CudaDeviceGuard guard(c.device().index);
  const int device = c.device().index;
  check_bias(bias, c, "gemm_bias_gelu");
  LOOM_CHECK(pre.shape() == c.shape() && pre.dtype() == c.dtype() && pre.is_contiguous(),
             "gemm_bias_gelu: pre must be contiguous like c ", shape_str(c.shape()));
  LOOM_CHECK(pre.device() == c.device(), "gemm_bias_gelu: pre and c on different devices");
  const LtGemm g = describe(a, b, c, trans_a, trans_b, "gemm_bias_gelu");
  if (try_fused(g, device, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias.raw_data(), pre.raw_data()))
    return;
  Tensor acc = epilogue_accumulator(pre);
  run_gemm_into(g, acc, device, "gemm_bias_gelu");
  launch_bias_epilogue(acc, pre, &c, bias, "gemm_bias_gelu");
}

// Note [DGELU_BGRAD through cuBLASLt]: with the library's D = dpreᵀ (m = our N rows, n = our M
// columns; Note [Row-major through cuBLASLt]), CUBLASLT_EPILOGUE_DGELU_BGRAD computes
// D = (A·B) ⊙ gelu'(aux) and writes the bias gradient, one value per row of D (length m = N),
// reduced over D's columns: Σ over our M rows, our dbias. What cublasLt.h (CUDA 13.0) documents
// and this relies on: the aux pointer is the GELU input matrix, read in the backward, of the
// output matrix's type, its ld (EPILOGUE_AUX_LD) a multiple of 8 and ≥ D's rows; the bias
// gradient vector is of the output type (Ctype) and its pointer's alignment is part of the
// heuristic's choice (so it is in the plan key). Transposes and dtypes the library lacks show up
// as no algorithm from the heuristic (or NOT_SUPPORTED, from the heuristic or when the plan
// runs), and the unfused path runs.
void gemm_dgelu_bgrad_cuda(const Tensor& a, const Tensor& b, const Tensor& pre, Tensor& dpre,
                           Tensor& dbias, bool trans_a, bool trans_b) {
  CudaDeviceGuard guard(dpre.device().index);
  const int device = dpre.device().index;
  LOOM_CHECK(a.dim() == 2 && b.dim() == 2 && dpre.dim() == 2,
             "gemm_dgelu_bgrad: operands must be 2-d");
  LOOM_CHECK(pre.shape() == dpre.shape() && pre.dtype() == dpre.dtype() && pre.is_contiguous() &&
                 dpre.is_contiguous(),
             "gemm_dgelu_bgrad: pre and dpre must be contiguous ", shape_str(dpre.shape()),
             " of one dtype");
  LOOM_CHECK(dbias.dim() == 1 && dbias.size(0) == dpre.size(1) && dbias.is_contiguous() &&
                 dbias.dtype() == dpre.dtype(),
             "gemm_dgelu_bgrad: dbias must be contiguous (", dpre.size(1), ") ",
             dtype_name(dpre.dtype()), ", got ", shape_str(dbias.shape()), " ",
             dtype_name(dbias.dtype()));
  LOOM_CHECK(dpre.dtype() == a.dtype(), "gemm_dgelu_bgrad: dpre dtype ", dtype_name(dpre.dtype()),
             " differs from the inputs' ", dtype_name(a.dtype()));
  LOOM_CHECK(pre.device() == dpre.device() && dbias.device() == dpre.device(),
             "gemm_dgelu_bgrad: pre, dpre and dbias on different devices");
  const LtGemm g = describe(a, b, dpre, trans_a, trans_b, "gemm_dgelu_bgrad");
  if (try_fused(g, device, CUBLASLT_EPILOGUE_DGELU_BGRAD, dbias.raw_data(), pre.raw_data())) {
    return;
  }
  Tensor acc = epilogue_accumulator(dpre);
  run_gemm_into(g, acc, device, "gemm_dgelu_bgrad");
  const int64_t m = dpre.size(0), n = dpre.size(1);
  if (m * n > 0) {
    LOOM_CUDA_DISPATCH_FLOAT(dpre.dtype(), "gemm_dgelu_bgrad", [&] {
      using A = acc_t<scalar_t>;
      dgelu_epilogue_kernel<scalar_t><<<grid_for(m * n, kThreads), kThreads, 0, compute_stream()>>>(
          static_cast<A*>(acc.raw_data()), static_cast<const scalar_t*>(pre.raw_data()),
          static_cast<scalar_t*>(dpre.raw_data()), m * n);
    });
    LOOM_CUDA_LAUNCH_CHECK();
  }
  // dbias = Σ over the rows of the unrounded products (zeros when M == 0), rounded once.
  if (acc.dtype() == dbias.dtype()) {
    find_kernel<sum_dim_forward_k>(DeviceType::kCuda)(acc, 1, m, n, dbias);
  } else {
    Tensor sum = Tensor::empty({n}, acc.dtype(), dbias.device());
    find_kernel<sum_dim_forward_k>(DeviceType::kCuda)(acc, 1, m, n, sum);
    find_kernel<copy_k>(DeviceType::kCuda)(sum, dbias);
  }
}

}  // namespace

LOOM_REGISTER_KERNEL(gemm, kCuda, gemm_cuda);
LOOM_REGISTER_KERNEL(gemm_bias, kCuda, gemm_bias_cuda);
LOOM_REGISTER_KERNEL(gemm_bias_gelu, kCuda, gemm_bias_gelu_cuda);
LOOM_REGISTER_KERNEL(gemm_dgelu_bgrad, kCuda, gemm_dgelu_bgrad_cuda);

}  // namespace loom::kernels::cuda
