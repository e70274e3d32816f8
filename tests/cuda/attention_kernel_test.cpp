// tests/cuda/attention_kernel_test.cpp — the CUDA causal attention kernels (kernels/cuda/
// attention*.cu) against the CPU kernels, forward and backward, for f32, bf16 and f16, head
// sizes taking both the tensor-core paths (bf16/f16: forward D = 64, 128; backward D = 64) and
// the general path (f32, and the other D), grouped-query heads, and sequence lengths that do
// not divide the tiles (16, 32 and 64 rows); and packed documents (doc_start, Note [Packed
// documents] in kernels/attention.h) on both paths, with documents that start inside and at the
// edges of the tiles, one-token documents and documents longer than a tile; and sliding windows
// (each row's first key moved up to i − W + 1), alone and over documents.
// Inputs are fresh normals (scale 1/√D keeps the softmax far from one-hot); forward outputs
// are poisoned first; backward gradients start from random contents, since the kernel
// accumulates into them. Uses only Loom's API (no CUDA headers); every test skips itself, with
// the reason, when the process sees no CUDA device.
//
// cuDNN's fused attention (Note [cuDNN attention]) is checked the same way, under its guard.
//
// Reference: the CPU kernel in f64 on the very values the GPU reads (16-bit inputs upcast), so
// only the GPU's own rounding is measured. Tolerances, relative L2 error (DESIGN §3):
//   out, dq, dk, dv: f32 1e-5; bf16, f16 1e-2 (results are rounded to 16 bits, and the
//                    tensor-core path rounds the probabilities to 16 bits before P·V);
//   lse (always f32): 1e-5 for f32 inputs, 1e-4 for 16-bit inputs (computed in f32 from exact
//                    products of the 16-bit values).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaAttentionTest = CudaTest;

double result_tol(DType dt) { return dt == DType::kF32 ? 1e-5 : 1e-2; }
double lse_tol(DType dt) { return dt == DType::kF32 ? 1e-5 : 1e-4; }

struct Case {
  DType dtype;
  int64_t b, hq, hkv, t, d;
  bool misaligned = false;         // inputs and gradients start 2 bytes into their GPU buffers
  std::vector<int64_t> docs = {};  // packed documents' lengths (summing to t), or none
  int64_t window = 0;              // a sliding window of this many keys (0: none)
  std::string str() const {
    std::string r = std::string(dtype_name(dtype)) + " B=" + std::to_string(b) +
                    " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
                    " T=" + std::to_string(t) + " D=" + std::to_string(d) +
                    (misaligned ? " misaligned" : "");
    if (!docs.empty()) r += " docs";
    for (int64_t n : docs) {
      r += " ";
      r += std::to_string(n);
    }
    if (window > 0) r += " window " + std::to_string(window);
    return r;
  }
  // doc_start (T) i32 on the host for docs and the window (each row's first key: Note [Packed
  // documents]), undefined without either.
  Tensor doc_start() const {
    if (docs.empty() && window == 0) return Tensor();
    std::vector<int32_t> ds;
    for (int64_t n : docs.empty() ? std::vector<int64_t>{t} : docs) {
      const auto start = static_cast<int32_t>(ds.size());
      for (int64_t i = 0; i < n; ++i) ds.push_back(start);
    }
    EXPECT_EQ(static_cast<int64_t>(ds.size()), t) << "docs must sum to T";
    for (int64_t i = 0; i < t && window > 0; ++i) {
      ds[static_cast<size_t>(i)] =
          std::max(ds[static_cast<size_t>(i)], static_cast<int32_t>(i - window + 1));
    }
    return Tensor::from_vector(ds, {t});
  }
  Tensor gpu_doc_start() const {
    const Tensor ds = doc_start();
    return ds.defined() ? ds.to(Device::cuda()) : Tensor();
  }
  Shape q_shape() const { return {b, hq, t, d}; }
  Shape kv_shape() const { return {b, hkv, t, d}; }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(d)); }
};

// The shapes of the brief: B = 2, Hq = 4 with Hkv ∈ {4, 2, 1}, odd and tile-sized T, and head
// sizes of both paths (24: not a multiple of 16).
std::vector<Case> standard_cases(DType dt) {
  std::vector<Case> cases;
  for (int64_t d : {16, 24, 64, 128}) {
    for (int64_t t : {1, 17, 64, 100, 257}) {
      for (int64_t hkv : {4, 2, 1}) cases.push_back({dt, 2, 4, hkv, t, d});
    }
  }
  return cases;
}

// Long sequences: several key tiles on every path.
std::vector<Case> long_cases(DType dt) {
  return {{dt, 2, 4, 2, 1024, 64}, {dt, 2, 4, 2, 1024, 128}, {dt, 1, 4, 1, 1000, 64}};
}

// A GPU copy of x that is a contiguous view one element into a larger buffer: not 16-byte
// aligned for 16-bit dtypes, so the launchers must fall back from the tensor-core path.
Tensor misaligned_cuda(const Tensor& x) {
  Tensor buffer = Tensor::empty({x.numel() + 1}, x.dtype(), Device::cuda());
  Tensor view = buffer.narrow(0, 1, x.numel()).view(x.shape());
  kernels::call_kernel<kernels::copy_k>(x.to(Device::cuda()), view);
  return view;
}

Tensor upload(const Case& c, const Tensor& x) {
  return c.misaligned ? misaligned_cuda(x) : x.to(Device::cuda());
}

double rms(const Tensor& x) {
  const std::vector<double> v = x.to_vector();
  double s = 0.0;
  for (double e : v) s += e * e;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

struct Inputs {
  Tensor q, k, v;  // CPU, the case's dtype
};

Inputs make_inputs(const Case& c, Generator& gen) {
  return {randn(c.q_shape(), gen, c.dtype), randn(c.kv_shape(), gen, c.dtype),
          randn(c.kv_shape(), gen, c.dtype)};
}

// The CPU kernel in f64: out (B,Hq,T,D) and lse (B,Hq,T).
void cpu_forward(const Case& c, const Inputs& in, Tensor& out, Tensor& lse) {
  out = Tensor::empty(c.q_shape(), DType::kF64);
  lse = Tensor::empty({c.b, c.hq, c.t}, DType::kF64);
  kernels::call_kernel<kernels::attention_forward_k>(in.q.to(DType::kF64), in.k.to(DType::kF64),
                                                     in.v.to(DType::kF64), c.doc_start(), c.scale(),
                                                     out, lse);
}

void check_forward(const Case& c, Generator& gen) {
  SCOPED_TRACE(c.str());
  const Inputs in = make_inputs(c, gen);
  Tensor out_ref, lse_ref;
  cpu_forward(c, in, out_ref, lse_ref);
  Tensor out = poisoned_cuda(c.q_shape(), c.dtype);
  Tensor lse = poisoned_cuda({c.b, c.hq, c.t}, DType::kF32);
  kernels::call_kernel<kernels::attention_forward_k>(
      upload(c, in.q), upload(c, in.k), upload(c, in.v), c.gpu_doc_start(), c.scale(), out, lse);
  EXPECT_LE(rel_error(out_ref, out), result_tol(c.dtype)) << "out";
  EXPECT_LE(rel_error(lse_ref, lse), lse_tol(c.dtype)) << "lse";
}

// Backward: the saved out is the reference output rounded to the case's dtype, lse the
// reference statistics in f32 (the layout the forward saves), dout fresh normals. Gradients
// start from random contents of the size of the increment (at least dv's, below), so a kernel
// that overwrites, or adds a wrong increment, fails.
struct BackwardRun {
  Tensor dq, dk, dv;
};

void check_backward(const Case& c, Generator& gen) {
  SCOPED_TRACE(c.str());
  const Inputs in = make_inputs(c, gen);
  Tensor out_ref, lse_ref;
  cpu_forward(c, in, out_ref, lse_ref);
  const Tensor out = out_ref.to(c.dtype);
  const Tensor lse = lse_ref.to(DType::kF32);
  const Tensor dout = randn(c.q_shape(), gen, c.dtype);

  const auto cpu_backward = [&](Tensor& dq, Tensor& dk, Tensor& dv) {
    kernels::call_kernel<kernels::attention_backward_k>(
        in.q.to(DType::kF64), in.k.to(DType::kF64), in.v.to(DType::kF64), c.doc_start(),
        out.to(DType::kF64), lse.to(DType::kF64), dout.to(DType::kF64), c.scale(), dq, dk, dv);
  };
  BackwardRun inc{Tensor::zeros(c.q_shape(), DType::kF64), Tensor::zeros(c.kv_shape(), DType::kF64),
                  Tensor::zeros(c.kv_shape(), DType::kF64)};
  cpu_backward(inc.dq, inc.dk, inc.dv);
  // Where a query sees one key (T = 1, one-token documents) the softmax is constant: dq and dk
  // are exactly 0, computed on both sides as a cancellation (dP − Σ dout·out) of terms the size
  // of dv's, whose rounding a relative error against ~0 would magnify without bound (seen on the
  // first GPU run). So every start is at least dv's size, the scale that rounding is relative to.
  const double floor = rms(inc.dv) + 1e-3;
  const BackwardRun start{randn(c.q_shape(), gen, c.dtype, 0.0, std::max(rms(inc.dq), floor)),
                          randn(c.kv_shape(), gen, c.dtype, 0.0, std::max(rms(inc.dk), floor)),
                          randn(c.kv_shape(), gen, c.dtype, 0.0, floor)};
  BackwardRun ref{start.dq.to(DType::kF64).clone(), start.dk.to(DType::kF64).clone(),
                  start.dv.to(DType::kF64).clone()};
  cpu_backward(ref.dq, ref.dk, ref.dv);

  BackwardRun gpu{upload(c, start.dq), upload(c, start.dk), upload(c, start.dv)};
  kernels::call_kernel<kernels::attention_backward_k>(
      upload(c, in.q), upload(c, in.k), upload(c, in.v), c.gpu_doc_start(), upload(c, out),
      lse.to(Device::cuda()), upload(c, dout), c.scale(), gpu.dq, gpu.dk, gpu.dv);
  EXPECT_LE(rel_error(ref.dq, gpu.dq), result_tol(c.dtype)) << "dq";
  EXPECT_LE(rel_error(ref.dk, gpu.dk), result_tol(c.dtype)) << "dk";
  EXPECT_LE(rel_error(ref.dv, gpu.dv), result_tol(c.dtype)) << "dv";
}

TEST_F(CudaAttentionTest, ForwardMatchesCpuF32) {
  Generator gen(101);
  for (const Case& c : standard_cases(DType::kF32)) check_forward(c, gen);
}

TEST_F(CudaAttentionTest, ForwardMatchesCpuBF16) {
  Generator gen(102);
  for (const Case& c : standard_cases(DType::kBF16)) check_forward(c, gen);
}

TEST_F(CudaAttentionTest, ForwardMatchesCpuF16) {
  Generator gen(103);
  for (const Case& c : standard_cases(DType::kF16)) check_forward(c, gen);
}

TEST_F(CudaAttentionTest, ForwardLongSequencesMatchCpu) {
  Generator gen(104);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : long_cases(dt)) check_forward(c, gen);
  }
}

TEST_F(CudaAttentionTest, BackwardMatchesCpuF32) {
  Generator gen(201);
  for (const Case& c : standard_cases(DType::kF32)) check_backward(c, gen);
}

TEST_F(CudaAttentionTest, BackwardMatchesCpuBF16) {
  Generator gen(202);
  for (const Case& c : standard_cases(DType::kBF16)) check_backward(c, gen);
}

TEST_F(CudaAttentionTest, BackwardMatchesCpuF16) {
  Generator gen(203);
  for (const Case& c : standard_cases(DType::kF16)) check_backward(c, gen);
}

TEST_F(CudaAttentionTest, BackwardLongSequencesMatchCpu) {
  Generator gen(204);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const Case& c : long_cases(dt)) check_backward(c, gen);
  }
}

// Packed documents: lengths that start documents inside 16-, 32- and 64-row tiles and on
// their edges (64, 128), one-token documents, and documents longer than a tile, so tiles are
// skipped, walked whole and masked at a boundary. bf16/f16 with D = 64 take the tensor-core
// paths (forward and backward), D = 128 its forward; f32 and D = 24 the general kernels.
std::vector<Case> packed_cases(DType dt) {
  std::vector<Case> cases;
  const std::vector<std::vector<int64_t>> layouts = {
      {1, 70, 130, 99},         // T = 300
      {64, 64, 1, 1, 127, 43},  // T = 300: starts on tile edges, then one-token documents
      {300},                    // one document: equal to plain causal
      {17, 5, 200, 33, 45},     // T = 300
  };
  for (int64_t d : {24, 64, 128}) {
    for (const auto& docs : layouts) {
      for (int64_t hkv : {4, 1}) cases.push_back({dt, 2, 4, hkv, 300, d, false, docs});
    }
  }
  cases.push_back({dt, 1, 4, 2, 1024, 64, false, {500, 3, 200, 321}});  // several tiles each
  cases.push_back({dt, 1, 2, 1, 5, 64, false, {1, 1, 1, 1, 1}});        // every token alone
  return cases;
}

TEST_F(CudaAttentionTest, PackedDocumentsForwardMatchesCpu) {
  Generator gen(701);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : packed_cases(dt)) check_forward(c, gen);
  }
}

TEST_F(CudaAttentionTest, PackedDocumentsBackwardMatchesCpu) {
  Generator gen(702);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : packed_cases(dt)) check_backward(c, gen);
  }
}

// A sliding window (Mistral's: row i sees keys max(its document's start, i − W + 1) … i, Note
// [Sliding window] in layers/transformer.cpp): windows narrower than a tile, equal to one, and
// spanning several, alone and over packed documents, on both paths.
std::vector<Case> window_cases(DType dt) {
  std::vector<Case> cases;
  for (int64_t d : {24, 64, 128}) {
    for (int64_t w : {1, 37, 64, 100}) {
      cases.push_back({dt, 2, 4, 2, 300, d, false, {}, w});
      cases.push_back({dt, 1, 4, 1, 300, d, false, {17, 5, 200, 33, 45}, w});
    }
  }
  cases.push_back({dt, 1, 4, 2, 1024, 64, false, {}, 250});
  return cases;
}

TEST_F(CudaAttentionTest, SlidingWindowMatchesCpu) {
  Generator gen(704);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& c : window_cases(dt)) {
      check_forward(c, gen);
      check_backward(c, gen);
    }
  }
}

// Misaligned 16-bit buffers with documents take the general path from a 16-bit dtype.
TEST_F(CudaAttentionTest, PackedDocumentsMisalignedMatchCpu) {
  Generator gen(703);
  for (const Case& c : {Case{DType::kBF16, 2, 4, 2, 300, 64, true, {1, 70, 130, 99}},
                        Case{DType::kF16, 1, 4, 1, 257, 128, true, {100, 100, 57}}}) {
    check_forward(c, gen);
    check_backward(c, gen);
  }
}

// Buffers that are not 16-byte aligned (contiguous views at an odd offset) take the general
// path and still match the CPU.
TEST_F(CudaAttentionTest, MisalignedBuffersMatchCpu) {
  Generator gen(501);
  for (const Case& c :
       {Case{DType::kBF16, 2, 4, 2, 100, 64, true}, Case{DType::kF16, 1, 4, 1, 257, 64, true},
        Case{DType::kBF16, 2, 4, 4, 70, 128, true}}) {
    check_forward(c, gen);
    check_backward(c, gen);
  }
}

// The same call twice gives the same bits: no atomics, no order-dependent sums (dk, dv sum the
// query heads of a kv group). Also for the forward, on both paths.
TEST_F(CudaAttentionTest, ResultsAreBitwiseReproducible) {
  Generator gen(301);
  for (const Case& c : {Case{DType::kBF16, 2, 4, 1, 257, 64}, Case{DType::kF32, 2, 4, 2, 100, 24},
                        Case{DType::kBF16, 2, 4, 1, 300, 64, false, {1, 70, 130, 99}},
                        Case{DType::kF32, 2, 4, 2, 300, 24, false, {17, 5, 200, 33, 45}}}) {
    SCOPED_TRACE(c.str());
    const Inputs in = make_inputs(c, gen);
    const Tensor q = in.q.to(Device::cuda()), k = in.k.to(Device::cuda()),
                 v = in.v.to(Device::cuda());
    const Tensor ds = c.gpu_doc_start();
    const Tensor dout = randn(c.q_shape(), gen, c.dtype).to(Device::cuda());
    std::vector<Tensor> runs;  // out, lse, dq, dk, dv of each run
    for (int run = 0; run < 2; ++run) {
      Tensor out = poisoned_cuda(c.q_shape(), c.dtype);
      Tensor lse = poisoned_cuda({c.b, c.hq, c.t}, DType::kF32);
      kernels::call_kernel<kernels::attention_forward_k>(q, k, v, ds, c.scale(), out, lse);
      Tensor dq = Tensor::zeros(c.q_shape(), c.dtype, Device::cuda());
      Tensor dk = Tensor::zeros(c.kv_shape(), c.dtype, Device::cuda());
      Tensor dv = Tensor::zeros(c.kv_shape(), c.dtype, Device::cuda());
      kernels::call_kernel<kernels::attention_backward_k>(q, k, v, ds, out, lse, dout, c.scale(),
                                                          dq, dk, dv);
      for (const Tensor& x : {out, lse, dq, dk, dv}) runs.push_back(x.to(Device::cpu()));
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (size_t i = 0; i < 5; ++i) expect_same_bits(runs[i], runs[i + 5], names[i]);
    EXPECT_GT(rms(runs[3]), 0.0) << "dk must not be all zeros";
  }
}

// ---- cuDNN's fused attention (Note [cuDNN attention]) ------------------------------------
// The same references and tolerances, under CudnnAttentionGuard, on the cases cuDNN handles:
// bf16/f16, D 64, 128 and 40 (a multiple of 8 that Loom's tensor-core kernels do not take),
// grouped-query heads, odd and long T. lse and gradients come from the CPU reference, so each
// cuDNN pass is checked on its own (its lse is Loom's contract, natural log).
class CudnnAttentionTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!kernels::cudnn_attention_built()) {
      GTEST_SKIP() << "this build has no cuDNN attention (cuDNN's frontend headers not found)";
    }
  }
};

// Fewer than Loom's own grid: each new shape costs cuDNN a graph build (plans compiled, a few
// hundred ms each), and the suite must stay well inside gpu_check.sh's 120 s per suite.
std::vector<Case> cudnn_cases(DType dt) {
  std::vector<Case> cases;
  for (int64_t d : {40, 64, 128}) {
    for (int64_t t : {2, 17, 257}) {  // cuDNN refuses T = 1 (Loom's kernels take it)
      for (int64_t hkv : {4, 1}) cases.push_back({dt, 2, 4, hkv, t, d});
    }
  }
  cases.push_back({dt, 2, 4, 2, 100, 64});  // a group of 2
  for (const Case& c : long_cases(dt)) cases.push_back(c);
  return cases;
}

TEST_F(CudnnAttentionTest, ForwardAndBackwardMatchCpu) {
  Generator gen(601);
  kernels::CudnnAttentionGuard cudnn;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cudnn_cases(dt)) {
      ASSERT_TRUE(kernels::cudnn_attention_handles(c.dtype, c.t, c.d)) << c.str();
      check_forward(c, gen);
      check_backward(c, gen);
    }
  }
}

// With packed documents the guard does not take cuDNN (whose graphs have no document mask):
// cases cuDNN would handle still match the CPU's masked reference.
TEST_F(CudnnAttentionTest, PackedDocumentsRunLoomsKernels) {
  Generator gen(603);
  kernels::CudnnAttentionGuard cudnn;
  for (const Case& c : {Case{DType::kBF16, 2, 4, 2, 300, 64, false, {1, 70, 130, 99}},
                        Case{DType::kF16, 1, 4, 1, 257, 40, false, {100, 100, 57}}}) {
    ASSERT_TRUE(kernels::cudnn_attention_handles(c.dtype, c.t, c.d)) << c.str();
    check_forward(c, gen);
    check_backward(c, gen);
  }
}

// The guard really changes the implementation: on the same inputs Loom's and cuDNN's lse
// (f32) differ in some bits (both within the tolerance of the reference, above), and the
// cuDNN results repeat bit for bit.
bool bits_equal(const Tensor& a_cpu, const Tensor& b_cpu) {
  const Tensor a = a_cpu.contiguous(), b = b_cpu.contiguous();
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())) == 0;
}

TEST_F(CudnnAttentionTest, GuardSelectsCudnnAndRepeats) {
  Generator gen(602);
  bool some_bits_differ = false;
  for (const Case& c :
       {Case{DType::kBF16, 2, 4, 2, 257, 64}, Case{DType::kF16, 1, 4, 1, 1000, 128}}) {
    SCOPED_TRACE(c.str());
    const Inputs in = make_inputs(c, gen);
    const Tensor q = in.q.to(Device::cuda()), k = in.k.to(Device::cuda()),
                 v = in.v.to(Device::cuda());
    std::vector<Tensor> lses;
    for (int run = 0; run < 3; ++run) {
      kernels::CudnnAttentionGuard choice(run > 0);  // Loom, cuDNN, cuDNN
      Tensor out = poisoned_cuda(c.q_shape(), c.dtype);
      Tensor lse = poisoned_cuda({c.b, c.hq, c.t}, DType::kF32);
      kernels::call_kernel<kernels::attention_forward_k>(q, k, v, Tensor(), c.scale(), out, lse);
      lses.push_back(lse.to(Device::cpu()));
    }
    some_bits_differ = some_bits_differ || !bits_equal(lses[0], lses[1]);
    expect_same_bits(lses[1], lses[2], "cuDNN lse");
    // The backward repeats bit for bit too (cuDNN's deterministic algorithm).
    kernels::CudnnAttentionGuard choice(true);
    Tensor out = poisoned_cuda(c.q_shape(), c.dtype);
    Tensor lse = poisoned_cuda({c.b, c.hq, c.t}, DType::kF32);
    kernels::call_kernel<kernels::attention_forward_k>(q, k, v, Tensor(), c.scale(), out, lse);
    const Tensor dout = randn(c.q_shape(), gen, c.dtype).to(Device::cuda());
    std::vector<Tensor> dqs;
    for (int run = 0; run < 2; ++run) {
      Tensor dq = Tensor::zeros(c.q_shape(), c.dtype, Device::cuda());
      Tensor dk = Tensor::zeros(in.k.shape(), c.dtype, Device::cuda()),
             dv = Tensor::zeros(in.v.shape(), c.dtype, Device::cuda());
      kernels::call_kernel<kernels::attention_backward_k>(q, k, v, Tensor(), out, lse, dout,
                                                          c.scale(), dq, dk, dv);
      dqs.push_back(dq.to(Device::cpu()));
    }
    expect_same_bits(dqs[0], dqs[1], "cuDNN dq");
  }
  EXPECT_TRUE(some_bits_differ) << "cuDNN's results are Loom's bit for bit: was cuDNN called?";
}

// Without a GPU: the graphs cuDNN's attention builds for every shape above pass the cuDNN
// frontend's own validation for Ampere (sm_80) and Hopper (sm_90) — dims, strides, dtypes,
// statistics layout, grouped-query heads. Needs only libcudnn (loaded, not run on a device).
// An impossible grouping (4 query heads over 3 kv heads) and T = 1 (which cuDNN refuses, so
// cudnn_attention_handles excludes it) are refused, so the check can fail.
TEST(CudnnAttentionGraph, ValidOnSm80AndSm90ForTheTestedShapes) {
  if (!kernels::cudnn_attention_built()) GTEST_SKIP() << "this build has no cuDNN attention";
  try {
    (void)kernels::cudnn_attention_graph_check(DType::kBF16, {1, 1, 8, 64}, {1, 1, 8, 64}, 90);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();  // libcudnn.so.9 not on this machine
  }
  for (int sm : {80, 90}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      std::vector<Case> cases = cudnn_cases(dt);
      // The models' shapes: TrainGpuTest's tiny GPT-2, and gpu_check.sh's GPT-2 350M and 1.5B
      // and Llama 1B (grouped-query).
      cases.push_back({dt, 4, 4, 4, 32, 16});
      cases.push_back({dt, 32, 16, 16, 1024, 64});
      cases.push_back({dt, 16, 25, 25, 1024, 64});
      cases.push_back({dt, 8, 32, 8, 2048, 64});
      for (const Case& c : cases) {
        EXPECT_EQ(kernels::cudnn_attention_graph_check(dt, c.q_shape(), c.kv_shape(), sm), "")
            << c.str() << " sm_" << sm;
      }
    }
  }
  const std::string refusal =
      kernels::cudnn_attention_graph_check(DType::kBF16, {2, 4, 64, 64}, {2, 3, 64, 64}, 90);
  EXPECT_NE(refusal.find("number of heads"), std::string::npos) << refusal;
  EXPECT_NE(kernels::cudnn_attention_graph_check(DType::kBF16, {2, 4, 1, 64}, {2, 4, 1, 64}, 90),
            "");
}

TEST_F(CudaAttentionTest, RejectsUnsupportedInput) {
  Generator gen(401);
  const Tensor q64 = randn({1, 2, 5, 8}, gen, DType::kF64).to(Device::cuda());
  Tensor out64 = poisoned_cuda({1, 2, 5, 8}, DType::kF64);
  Tensor lse64 = poisoned_cuda({1, 2, 5}, DType::kF64);
  EXPECT_THROW(kernels::call_kernel<kernels::attention_forward_k>(q64, q64, q64, Tensor(), 0.5,
                                                                  out64, lse64),
               Error);
  const Tensor q = randn({1, 2, 5, 136}, gen, DType::kF32).to(Device::cuda());
  Tensor out = poisoned_cuda({1, 2, 5, 136}, DType::kF32);
  Tensor lse = poisoned_cuda({1, 2, 5}, DType::kF32);
  EXPECT_THROW(kernels::call_kernel<kernels::attention_forward_k>(q, q, q, Tensor(), 0.5, out, lse),
               Error);
  // doc_start of the wrong length or dtype.
  const Tensor q16 = randn({1, 2, 5, 64}, gen, DType::kBF16).to(Device::cuda());
  Tensor out16 = poisoned_cuda({1, 2, 5, 64}, DType::kBF16);
  Tensor lse16 = poisoned_cuda({1, 2, 5}, DType::kF32);
  for (const Tensor& bad : {Tensor::zeros({4}, DType::kI32, Device::cuda()),
                            Tensor::zeros({5}, DType::kI64, Device::cuda())}) {
    EXPECT_THROW(
        kernels::call_kernel<kernels::attention_forward_k>(q16, q16, q16, bad, 0.5, out16, lse16),
        Error);
  }
}

}  // namespace
}  // namespace loom
