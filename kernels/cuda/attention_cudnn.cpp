// kernels/cuda/attention_cudnn.cpp — causal attention through cuDNN's fused flash attention
// (its graph API, through the C++ frontend's sdpa / sdpa_backward nodes): the checked
// alternative to Loom's own kernels that Note [cuDNN attention] (kernels/attention.h) describes.
// The launchers in attention.cu call it when cudnn_attention_takes() holds.
//
// One cuDNN handle per (thread, device), made at first use and bound to compute_stream() at
// every call, holds the graphs built so far, one per (pass, dtype, shape, scale): building a
// graph (heuristics, plan compilation) costs milliseconds, so it happens on a shape's first
// step only. Tensors are described with Loom's layouts, so nothing is copied:
//   q, out, dout, dq (B, Hq, T, D), k, v, dk, dv (B, Hkv, T, D), strides (H·T·D, T·D, D, 1);
//   lse (B, Hq, T) as cuDNN's softmax statistics (B, Hq, T, 1), f32, natural log.
// cuDNN writes dq, dk, dv; the contract accumulates, so they land in temporaries first and are
// added (axpy) into the caller's. The backward asks for cuDNN's deterministic algorithm (the
// contract's run-to-run bits; otherwise dq is summed with atomics for large shapes). The workspace
// comes from the caching allocator. Built only when CMake found the frontend headers
// (LOOM_HAS_CUDNN_FRONTEND); otherwise no call reaches the two passes, which then say how to get
// them.
//
// libcudnn is loaded at first use (dlopen, the frontend's NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
// mode), not linked: a machine without cuDNN 9 runs everything else, and asking for cuDNN
// attention there is an error that says what is missing.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/attention.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.cuh"
#include "kernels/elementwise.h"

#if LOOM_HAS_CUDNN_FRONTEND
#include <cudnn_frontend.h>

// The frontend's handle of the dlopen'ed libcudnn (it declares it, the program defines it):
// written once, by load_cudnn() below, under a once_flag.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace loom::kernels::cuda {

bool cudnn_attention_takes(std::initializer_list<const Tensor*> buffers, const AttnShape& s,
                           DType dtype) {
  if (!cudnn_attention_requested() || !cudnn_attention_handles(dtype, s.t, s.d)) return false;
  for (const Tensor* t : buffers) {
    if (!aligned16(*t)) return false;
  }
  return true;
}

#if LOOM_HAS_CUDNN_FRONTEND

namespace {

namespace fe = ::cudnn_frontend;

// Loads libcudnn.so.9 once per process; returns the loader's message when it could not (empty
// when it is loaded).
const std::string& cudnn_load_failure() {
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (fe::cudnn_dlhandle == nullptr) {
      const char* why = dlerror();
      failure = why != nullptr ? why : "unknown dlopen error";
    }
  });
  return failure;
}

// Loads libcudnn.so.9; throws, naming the library and the loader's message, when it cannot.
void load_cudnn() {
  const std::string& failure = cudnn_load_failure();
  LOOM_CHECK(failure.empty(), "cuDNN attention: cannot load libcudnn.so.9 (", failure,
             "); put cuDNN 9 on the library path or set train.attention_kernel: loom");
}

// CUDNN_CHECK(fe::detail::create_handle(&h)): throws loom::Error naming the call, cuDNN's
// status and the call site. FE_CHECK(graph.validate()): the same for the frontend's error_t
// (not const: its get_message() is not).
#define CUDNN_CHECK(call)                                                                        \
  do {                                                                                           \
    const cudnnStatus_t loom_cudnn_st_ = (call);                                                 \
    if (loom_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                                                \
      throw ::loom::Error(                                                                       \
          ::loom::detail::str(#call, " failed: ", fe::detail::get_error_string(loom_cudnn_st_)), \
          __FILE__, __LINE__);                                                                   \
    }                                                                                            \
  } while (0)
#define FE_CHECK(call)                                                                  \
  do {                                                                                  \
    fe::error_t loom_fe_err_ = (call);                                                  \
    if (!loom_fe_err_.is_good()) {                                                      \
      throw ::loom::Error(::loom::detail::str("cuDNN attention: ", #call,               \
                                              " failed: ", loom_fe_err_.get_message()), \
                          __FILE__, __LINE__);                                          \
    }                                                                                   \
  } while (0)

// Tensor uids in the graphs' variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

enum class Pass { kForward, kBackward };

// What a built graph depends on: the pass, the dtype, the shape and the scale's bits.
using GraphKey = std::tuple<Pass, DType, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t>;

GraphKey graph_key(Pass pass, DType dtype, const AttnShape& s, float scale) {
  uint32_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  return {pass, dtype, s.b, s.hq, s.hkv, s.t, s.d, bits};
}

// A (B, H, T, D) tensor in Loom's contiguous layout: named, numbered, dims and strides set.
fe::graph::Tensor_attributes& describe_bhtd(fe::graph::Tensor_attributes& t, const char* name,
                                            Uid uid, const AttnShape& s, int64_t heads) {
  return t.set_name(name)
      .set_uid(uid)
      .set_dim({s.b, heads, s.t, s.d})
      .set_stride({heads * s.t * s.d, s.t * s.d, s.d, 1});
}

// A graph input of that layout.
std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const AttnShape& s, int64_t heads) {
  fe::graph::Tensor_attributes t;
  return g.tensor(describe_bhtd(t, name, uid, s, heads));
}

// The statistics: lse (B, Hq, T) seen as (B, Hq, T, 1), f32.
void describe_stats(fe::graph::Tensor_attributes& t, const AttnShape& s) {
  t.set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({s.b, s.hq, s.t, 1})
      .set_stride({s.hq * s.t, s.t, 1, 1});
}

// A graph output of that layout.
void describe_output(fe::graph::Tensor_attributes& t, const char* name, Uid uid, const AttnShape& s,
                     int64_t heads) {
  describe_bhtd(t, name, uid, s, heads).set_output(true);
}

// A graph of 16-bit inputs computing in f32. sm_version > 0 describes a GPU instead of reading
// the current one (validation without a GPU): its architecture and SM count (A100: 108,
// H100/H200: 132; the count does not change what is valid). Set before any node is added,
// since nodes copy the graph's context.
std::unique_ptr<fe::graph::Graph> new_graph(DType dtype, int sm_version) {
  auto g = std::make_unique<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version).set_sm_count(sm_version >= 90 ? 132 : 108);
  g->set_io_data_type(dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// out, stats = causal flash attention of q, k, v (grouped-query when Hkv < Hq).
std::unique_ptr<fe::graph::Graph> forward_graph(DType dtype, const AttnShape& s, float scale,
                                                int sm_version) {
  auto g = new_graph(dtype, sm_version);
  auto [o, stats] = g->sdpa(input(*g, "q", kQ, s, s.hq), input(*g, "k", kK, s, s.hkv),
                            input(*g, "v", kV, s, s.hkv),
                            fe::graph::SDPA_attributes()
                                .set_name("loom_attention_forward")
                                .set_generate_stats(true)
                                .set_causal_mask(true)
                                .set_attn_scale(scale));
  describe_output(*o, "out", kO, s, s.hq);
  stats->set_output(true).set_name("lse");
  describe_stats(*stats, s);
  return g;
}

// dq, dk, dv of the causal attention, from q, k, v, out, dout and the statistics.
std::unique_ptr<fe::graph::Graph> backward_graph(DType dtype, const AttnShape& s, float scale,
                                                 int sm_version) {
  auto g = new_graph(dtype, sm_version);
  fe::graph::Tensor_attributes stats_desc;
  stats_desc.set_name("lse");
  describe_stats(stats_desc, s);
  auto [dq, dk, dv] = g->sdpa_backward(input(*g, "q", kQ, s, s.hq), input(*g, "k", kK, s, s.hkv),
                                       input(*g, "v", kV, s, s.hkv), input(*g, "out", kO, s, s.hq),
                                       input(*g, "dout", kDO, s, s.hq), g->tensor(stats_desc),
                                       fe::graph::SDPA_backward_attributes()
                                           .set_name("loom_attention_backward")
                                           .set_causal_mask(true)
                                           .set_attn_scale(scale)
                                           // Without it, large shapes (and every shape on
                                           // sm_80) sum dq with atomics: bits would vary by run.
                                           .set_deterministic_algorithm(true));
  describe_output(*dq, "dq", kDQ, s, s.hq);
  describe_output(*dk, "dk", kDK, s, s.hkv);
  describe_output(*dv, "dv", kDV, s, s.hkv);
  return g;
}

// The cuDNN handle of one (thread, device) and the graphs it has built.
class CudnnContext {
 public:
  explicit CudnnContext(int device) {
    load_cudnn();
    CudaDeviceGuard guard(device);
    CUDNN_CHECK(fe::detail::create_handle(&handle_));
  }
  // At exit the runtime may be unloading: errors are ignored.
  ~CudnnContext() {
    graphs_.clear();  // their plans were built on the handle
    (void)fe::detail::destroy_handle(handle_);
  }
  CudnnContext(const CudnnContext&) = delete;
  CudnnContext& operator=(const CudnnContext&) = delete;

  // The handle, bound to compute_stream().
  cudnnHandle_t handle() {
    CUDNN_CHECK(fe::detail::set_stream(handle_, compute_stream()));
    return handle_;
  }

  // The graph for `key`, built by `make` (validated, lowered, planned) at first use.
  template <typename Make>
  const fe::graph::Graph& graph(const GraphKey& key, Make make) {
    std::unique_ptr<fe::graph::Graph>& slot = graphs_[key];
    if (!slot) {
      std::unique_ptr<fe::graph::Graph> g = make();
      FE_CHECK(g->validate());
      FE_CHECK(g->build_operation_graph(handle_));
      FE_CHECK(g->create_execution_plans({fe::HeurMode_t::A}));
      FE_CHECK(g->check_support());
      FE_CHECK(g->build_plans(handle_));
      slot = std::move(g);
    }
    return *slot;
  }

 private:
  cudnnHandle_t handle_ = nullptr;
  std::map<GraphKey, std::unique_ptr<fe::graph::Graph>> graphs_;
};

CudnnContext& cudnn_context(int device) {
  thread_local std::map<int, std::unique_ptr<CudnnContext>> contexts;
  std::unique_ptr<CudnnContext>& slot = contexts[device];
  if (!slot) slot = std::make_unique<CudnnContext>(device);
  return *slot;
}

// Runs `g` on the compute stream with a workspace from the caching allocator.
void execute(CudnnContext& ctx, const fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack,
             const Device& device) {
  int64_t bytes = 0;
  FE_CHECK(g.get_workspace_size(bytes));
  Tensor workspace = Tensor::empty({(bytes + 7) / 8 + 1}, DType::kI64, device);
  FE_CHECK(g.execute(ctx.handle(), pack, workspace.raw_data()));
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.raw_data()); }

}  // namespace

}  // namespace loom::kernels::cuda

namespace loom::kernels {

std::string cudnn_attention_graph_check(DType dtype, const Shape& q_shape, const Shape& kv_shape,
                                        int sm_version) {
  LOOM_CHECK(q_shape.size() == 4 && kv_shape.size() == 4 && q_shape[0] == kv_shape[0] &&
                 q_shape[2] == kv_shape[2] && q_shape[3] == kv_shape[3],
             "cudnn_attention_graph_check: q ", shape_str(q_shape), " and k ", shape_str(kv_shape),
             " do not match");
  LOOM_CHECK(dtype == DType::kBF16 || dtype == DType::kF16,
             "cudnn_attention_graph_check: dtype must be bf16 or f16, got ", dtype_name(dtype));
  cuda::load_cudnn();
  const int64_t group = kv_shape[1] > 0 ? q_shape[1] / kv_shape[1] : 0;
  const cuda::AttnShape s{q_shape[0], q_shape[1], kv_shape[1], q_shape[2], q_shape[3], group};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  for (auto make : {cuda::forward_graph, cuda::backward_graph}) {
    std::unique_ptr<cuda::fe::graph::Graph> g = make(dtype, s, scale, sm_version);
    cuda::fe::error_t err = g->validate();
    if (!err.is_good()) return err.get_message();
  }
  return "";
}

bool cudnn_attention_loadable(std::string* why) {
  const std::string& failure = cuda::cudnn_load_failure();
  if (why != nullptr && !failure.empty()) *why = "cannot load libcudnn.so.9: " + failure;
  return failure.empty();
}

}  // namespace loom::kernels

namespace loom::kernels::cuda {

void cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttnShape& s,
                             float scale, Tensor& out, Tensor& lse) {
  CudnnContext& ctx = cudnn_context(q.device().index);
  const fe::graph::Graph& g = ctx.graph(graph_key(Pass::kForward, q.dtype(), s, scale),
                                        [&] { return forward_graph(q.dtype(), s, scale, 0); });
  std::unordered_map<int64_t, void*> pack = {
      {kQ, ptr(q)}, {kK, ptr(k)}, {kV, ptr(v)}, {kO, out.raw_data()}, {kStats, lse.raw_data()}};
  execute(ctx, g, pack, q.device());
}

void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, const AttnShape& s,
                              float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  CudnnContext& ctx = cudnn_context(q.device().index);
  const fe::graph::Graph& g = ctx.graph(graph_key(Pass::kBackward, q.dtype(), s, scale),
                                        [&] { return backward_graph(q.dtype(), s, scale, 0); });
  Tensor dq_new = Tensor::empty(dq.shape(), dq.dtype(), dq.device());
  Tensor dk_new = Tensor::empty(dk.shape(), dk.dtype(), dk.device());
  Tensor dv_new = Tensor::empty(dv.shape(), dv.dtype(), dv.device());
  std::unordered_map<int64_t, void*> pack = {{kQ, ptr(q)},
                                             {kK, ptr(k)},
                                             {kV, ptr(v)},
                                             {kO, ptr(out)},
                                             {kStats, ptr(lse)},
                                             {kDO, ptr(dout)},
                                             {kDQ, dq_new.raw_data()},
                                             {kDK, dk_new.raw_data()},
                                             {kDV, dv_new.raw_data()}};
  execute(ctx, g, pack, q.device());
  call_kernel<axpy_k>(1.0, dq_new, dq);
  call_kernel<axpy_k>(1.0, dk_new, dk);
  call_kernel<axpy_k>(1.0, dv_new, dv);
}

#else  // !LOOM_HAS_CUDNN_FRONTEND: cudnn_attention_takes() is false, so these are not reached.

void cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, const AttnShape&, float,
                             Tensor&, Tensor&) {
  LOOM_FAIL("cuDNN attention: this build has no cuDNN frontend (tools/install_deps.sh fetches it)");
}

void cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const AttnShape&, float, Tensor&,
                              Tensor&, Tensor&) {
  LOOM_FAIL("cuDNN attention: this build has no cuDNN frontend (tools/install_deps.sh fetches it)");
}

#endif

}  // namespace loom::kernels::cuda
