// tests/conformance/conformance.cpp — the table of registered ops and the input helpers of
// conformance.h. Holds no checks (conformance_test.cpp does).
#include "tests/conformance/conformance.h"

#include <algorithm>

namespace loom::conformance {
namespace {

std::vector<OpCases>& table() {
  static std::vector<OpCases> ops;  // filled before main(), read-only afterwards
  return ops;
}

}  // namespace

double Tolerance::of(DType dt) const {
  switch (dt) {
    case DType::kF64:
      return f64;
    case DType::kBF16:
      return bf16;
    case DType::kF16:
      return f16;
    default:
      return f32;
  }
}

int register_op(const char* op, CaseFn fn) {
  table().push_back({op, fn});
  return 0;
}

std::vector<OpCases> registered_ops() {
  std::vector<OpCases> ops = table();
  std::sort(ops.begin(), ops.end(), [](const OpCases& a, const OpCases& b) { return a.op < b.op; });
  return ops;
}

Tensor grad_input(const Shape& shape, Generator& gen, double std) {
  return randn(shape, gen, DType::kF64, 0.0, std).set_requires_grad(true);
}

Tensor const_input(const Shape& shape, Generator& gen, double std) {
  return randn(shape, gen, DType::kF64, 0.0, std);
}

Tensor grad_uniform(const Shape& shape, Generator& gen, double lo, double hi) {
  return rand(shape, gen, DType::kF64, lo, hi).set_requires_grad(true);
}

std::string shape_name(const Shape& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

}  // namespace loom::conformance
