// tests/conformance/conformance.h — the kernel conformance table (DESIGN §11; after ggml, which
// tests every op on every backend from one table of cases). Each op registers its cases once, in
// tests/conformance/cases/<op>.cpp; conformance_test.cpp turns every case into gtest tests
// (Table/Conformance.Check/<name>):
//   <op>__<case>_gradcheck  f64 on the CPU against central differences (tests/gradcheck.h);
//   <op>__<case>_cpu_f32    the CPU in f32 against the CPU in f64 on the same values, then the
//                           backend comparison below run on the CPU itself with every input
//                           offset one element into its buffer;
//   <op>__<case>_<backend>  for every other backend (cuda), forward and backward in each of the
//                           case's dtypes against the CPU on the same values, contiguous and
//                           offset inputs; skipped, naming them, when the backend lacks one of
//                           the case's kernels.
// A backend this build lacks, or one the machine has no device for (decided when the binary
// starts), gets one skipped test <backend>_unavailable saying why, instead of one per case.
// ctest groups them (a process start costs ~0.2 s in a CUDA build): conformance.<op> runs the
// op's CPU checks, conformance.<backend> every case on that backend (tests/CMakeLists.txt).
// A case is an op applied through core/ops/ (so autograd records it) to inputs it builds itself.
// Registering one:
//
//   LOOM_CONFORMANCE_CASES(gelu) {
//     for (const Shape& s : {Shape{17}, Shape{2, 3, 65}}) {
//       cases.push_back({.name = shape_name(s),
//                        .kernels = {"gelu_forward", "gelu_backward"},
//                        .inputs = [s](Generator& gen) { return Inputs{grad_input(s, gen, 2.0)}; },
//                        .op = [](const Inputs& in) { return Outputs{ops::gelu(in[0])}; }});
//     }
//   }
//
// Test-only: uses Loom's public API and nothing device-specific, so it builds in every build.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace loom::conformance {

using Inputs = std::vector<Tensor>;
using Outputs = std::vector<Tensor>;

const std::vector<DType> kFloatDTypes = {DType::kF64, DType::kF32, DType::kBF16, DType::kF16};
const std::vector<DType> kNoF64 = {DType::kF32, DType::kBF16, DType::kF16};

// Relative errors ‖got − want‖ / ‖want‖ over a whole tensor (NaN or an infinity where want is
// finite never passes), per dtype of the run on the backend. 16-bit runs are compared with the
// CPU in f32 on the same 16-bit values (the CPU kernels take f32 and f64 only).
struct Tolerance {
  double f64 = 1e-12;
  double f32 = 1e-5;
  double bf16 = 1e-2;
  double f16 = 1e-2;
  double cpu_f32 = 1e-5;  // the CPU in f32 against the CPU in f64
  double of(DType dt) const;
};

// expect_gradcheck's parameters (tests/gradcheck.h).
struct Gradcheck {
  double eps = 1e-6, atol = 1e-6, rtol = 1e-5;
  int max_probes = 120;
};

struct Case {
  // Unique within the op; letters, digits and '_' (it becomes part of a test name).
  std::string name;
  // The registry kernels the op runs, forward and backward (kernels/kernel_list.h): a backend
  // that lacks one is skipped, naming it.
  std::vector<std::string> kernels;
  // The inputs, on the CPU: floating ones in f64 (the harness rounds them to each dtype and
  // copies them to each device, so every run sees the same values), those to differentiate
  // marked requires_grad; integer ones (ids, targets, positions) are copied as they are. Random,
  // never all zeros; called with a generator seeded from the op and case names.
  std::function<Inputs(Generator&)> inputs;
  // The op through core/ops/, on inputs of any one device and dtype; every output is compared,
  // and backward is seeded with random gradients of every output that requires grad.
  std::function<Outputs(const Inputs&)> op;
  // The dtypes compared on the other backends (empty: none). The CPU checks run in f64 and f32.
  std::vector<DType> dtypes = kFloatDTypes;
  Tolerance tol = {};
  Gradcheck grad = {};
  bool gradcheck = true;  // the f64 central-difference check
  bool cpu_f32 = true;    // the CPU f32 check
};

using CaseFn = void (*)(std::vector<Case>& cases);

struct OpCases {
  std::string op;
  CaseFn fn;
};

// Adds an op's case function to the table (at static initialisation, from the macro below; the
// table is read-only afterwards, as the kernel registry is: Note [Process-wide registries] in
// core/allocator.h). Returns a dummy for the registering static.
int register_op(const char* op, CaseFn fn);
// Every registered op, sorted by name.
std::vector<OpCases> registered_ops();

// ---- helpers for building inputs ----

// Random normal f64 (std `std`) that requires grad.
Tensor grad_input(const Shape& shape, Generator& gen, double std = 1.0);
// Random normal f64 that does not require grad (a constant of the op).
Tensor const_input(const Shape& shape, Generator& gen, double std = 1.0);
// f64 in [lo, hi) that requires grad (e.g. divisors away from zero).
Tensor grad_uniform(const Shape& shape, Generator& gen, double lo, double hi);
// "3x17"; "scalar" for 0-d.
std::string shape_name(const Shape& shape);

}  // namespace loom::conformance

// Defines the function that fills `cases` for op `op` (an identifier without "__": the name the
// test names start with) and registers it. Write it at the start of a line: tests/CMakeLists.txt
// finds the ops from these lines.
#define LOOM_CONFORMANCE_CASES(op)                                                        \
  static void loom_conformance_cases_##op(std::vector<::loom::conformance::Case>& cases); \
  [[maybe_unused]] static const int loom_conformance_registered_##op =                    \
      ::loom::conformance::register_op(#op, &loom_conformance_cases_##op);                \
  static void loom_conformance_cases_##op(std::vector<::loom::conformance::Case>& cases)
