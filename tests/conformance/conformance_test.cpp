// tests/conformance/conformance_test.cpp — runs the conformance table (conformance.h): one
// value-parameterised test whose parameters are every (op, case, check), named
// <op>__<case>_<check>. Checks: gradcheck (f64, CPU, central differences), cpu_f32 (CPU f32
// against f64, and the CPU with offset inputs against the contiguous run), and one per other
// backend (forward and backward in each dtype against the CPU). A backend that cannot run here
// (not in this build, or no device: decided when the binary starts) gets a single skipped
// test, <backend>_unavailable, saying why, instead of one per case. ctest runs them grouped
// (tests/CMakeLists.txt): conformance.<op> (its CPU checks) and conformance.<backend>.
#include "tests/conformance/conformance.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/registry.h"
#include "tests/gradcheck.h"

namespace loom::conformance {
namespace {

// The backends compared with the CPU: every device type but the CPU.
const std::vector<DeviceType> kBackends = {DeviceType::kCuda};

enum class Kind { kGradcheck, kCpuF32, kBackend, kNoBackend, kBadCase };

struct Check {
  std::string name;  // the test name: <op>_<case>_<check>
  Kind kind;
  std::string op;
  Case c;
  DeviceType backend = DeviceType::kCpu;
  std::string message;  // kNoBackend, kBadCase: what to report
};

Check make_check(std::string name, Kind kind, std::string op, Case c,
                 DeviceType backend = DeviceType::kCpu, std::string message = "") {
  return {std::move(name), kind, std::move(op), std::move(c), backend, std::move(message)};
}

bool valid_name(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return false;
  }
  return true;
}

// Why backend t cannot run any case here (no backend in this build, or no device); empty when it
// can.
std::string backend_unusable(DeviceType t) {
  const std::string b = device_type_name(t);
  if (kernels::Registry::instance().names(t).empty()) return "this build has no " + b + " backend";
  if (device_count(t) <= 0)
    return "no " + b + " device: the process sees none (no device or driver)";
  return "";
}

// Every check of every registered case, built once (after static initialisation: gtest evaluates
// the parameter generator when it registers the tests).
const std::vector<Check>& all_checks() {
  static const std::vector<Check> checks = [] {
    std::vector<Check> out;
    std::set<std::string> names;
    int compared = 0;
    std::vector<DeviceType> usable;
    for (DeviceType t : kBackends) {
      if (backend_unusable(t).empty()) usable.push_back(t);
    }
    for (const OpCases& op : registered_ops()) {
      std::vector<Case> cases;
      op.fn(cases);
      for (const Case& c : cases) {
        const std::string base = op.op + "__" + c.name;
        if (!valid_name(c.name) || !names.insert(base).second || !c.inputs || !c.op) {
          out.push_back(make_check(base + "_bad_case_" + std::to_string(out.size()), Kind::kBadCase,
                                   op.op, c, DeviceType::kCpu,
                                   "case '" + c.name + "' of op " + op.op +
                                       ": the name is empty, has characters other than letters, "
                                       "digits and '_', or repeats, or inputs/op is missing"));
          continue;
        }
        if (c.gradcheck) out.push_back(make_check(base + "_gradcheck", Kind::kGradcheck, op.op, c));
        if (c.cpu_f32) out.push_back(make_check(base + "_cpu_f32", Kind::kCpuF32, op.op, c));
        if (c.dtypes.empty()) continue;
        ++compared;
        for (DeviceType t : usable) {
          out.push_back(make_check(base + "_" + device_type_name(t), Kind::kBackend, op.op, c, t));
        }
      }
    }
    for (DeviceType t : kBackends) {
      const std::string reason = backend_unusable(t);
      if (reason.empty()) continue;
      out.push_back(
          make_check(std::string(device_type_name(t)) + "_unavailable", Kind::kNoBackend, "", {}, t,
                     std::string("conformance: ") + device_type_name(t) + " unavailable (" +
                         reason + "): " + std::to_string(compared) + " cases not compared on it"));
    }
    return out;
  }();
  return checks;
}

// FNV-1a of the case's name: every run of a case sees the same inputs; LOOM_CONFORMANCE_SEED=n
// mixes n in (other inputs, e.g. to try a tolerance on many).
uint64_t seed_of(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  if (const char* extra = std::getenv("LOOM_CONFORMANCE_SEED")) {
    h = (h ^ std::strtoull(extra, nullptr, 10)) * 1099511628211ull;
  }
  return h;
}

// The outputs as one tensor (flattened and concatenated), for tests/gradcheck.h's one-output
// checks.
testing::OpFn as_one_output(const Case& c) {
  return [op = c.op](const std::vector<Tensor>& in) {
    const Outputs outs = op(in);
    if (outs.size() == 1) return outs[0];
    std::vector<Tensor> flat;
    for (const Tensor& o : outs) flat.push_back(ops::reshape(o, {-1}));
    return ops::cat(flat, 0);
  };
}

// ‖got − want‖ / ‖want‖ in double on the host; +inf when got holds a NaN or an infinity that
// want does not; 0 when both are zero.
double rel_error(const Tensor& want, const Tensor& got) {
  const std::vector<double> a = want.to(Device::cpu()).to_vector();
  const std::vector<double> b = got.to(Device::cpu()).to_vector();
  EXPECT_EQ(a.size(), b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) || (!std::isfinite(b[i]) && std::isfinite(a[i]))) {
      return std::numeric_limits<double>::infinity();
    }
    if (!std::isfinite(a[i]) && a[i] == b[i]) continue;  // the same infinity
    num += (b[i] - a[i]) * (b[i] - a[i]);
    den += a[i] * a[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

// A copy of x on `device`; when `offset`, a contiguous view one element into a larger buffer
// (not 16-byte aligned, so vectorised paths must fall back).
Tensor upload(const Tensor& x, Device device, bool offset) {
  if (!offset) return x.to(device).clone();
  Tensor flat = Tensor::empty({x.numel() + 1}, x.dtype(), device);
  Tensor view = flat.narrow(0, 1, x.numel()).view(x.shape());
  ops::copy_(view, x.to(device));
  return view;
}

// The case on `device` in dtype dt (inputs offset or not) against the CPU in dt's reference
// dtype (f64 for f64, f32 otherwise) on the same values: outputs, then the gradients of every
// input requiring grad after backward seeded with the same random output gradients.
void compare(const Case& c, uint64_t seed, Device device, DType dt, bool offset) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " on " + device.str() +
               (offset ? ", inputs offset by one element" : ", contiguous inputs"));
  const double tol = c.tol.of(dt);
  const DType ref_dt = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  Generator gen(seed);
  const Inputs master = c.inputs(gen);
  Inputs ref, dev;
  for (const Tensor& m : master) {
    if (!is_floating(m.dtype())) {
      ref.push_back(m);
      dev.push_back(upload(m, device, false));
      continue;
    }
    const Tensor stored = m.detach().to(dt);  // the values both runs see
    Tensor r = stored.to(ref_dt).clone(), d = upload(stored, device, offset);
    if (m.requires_grad()) {
      r.set_requires_grad(true);
      d.set_requires_grad(true);
    }
    ref.push_back(r);
    dev.push_back(d);
  }
  const Outputs want = c.op(ref), got = c.op(dev);
  ASSERT_EQ(want.size(), got.size());
  std::vector<Tensor> roots_ref, roots_dev, seeds_ref, seeds_dev;
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].shape(), want[k].shape()) << "output " << k;
    EXPECT_EQ(got[k].device(), device) << "output " << k;
    const double err = rel_error(want[k], got[k]);
    EXPECT_LE(err, tol) << "output " << k << ": relative error " << err;
    if (!got[k].requires_grad()) continue;
    const Tensor s = randn(got[k].shape(), gen, DType::kF64).to(got[k].dtype());
    roots_ref.push_back(want[k]);
    roots_dev.push_back(got[k]);
    seeds_ref.push_back(s.to(want[k].dtype()));
    seeds_dev.push_back(s.to(device));
  }
  if (roots_dev.empty()) return;
  autograd::backward(roots_ref, seeds_ref);
  autograd::backward(roots_dev, seeds_dev);
  for (size_t i = 0; i < dev.size(); ++i) {
    if (!dev[i].requires_grad()) continue;
    ASSERT_TRUE(ref[i].grad().defined()) << "input " << i << " got no gradient on the CPU";
    ASSERT_TRUE(dev[i].grad().defined()) << "input " << i << " got no gradient on " << device.str();
    EXPECT_EQ(dev[i].grad().device(), device) << "gradient of input " << i;
    const double err = rel_error(ref[i].grad(), dev[i].grad());
    EXPECT_LE(err, tol) << "gradient of input " << i << ": relative error " << err;
  }
}

// Why the case cannot run on (usable) backend t: the kernels it lacks; empty when it can.
std::string unavailable(const Case& c, DeviceType t) {
  std::string missing;
  for (const std::string& k : c.kernels) {
    if (!kernels::Registry::instance().has(k, t)) missing += (missing.empty() ? "" : ", ") + k;
  }
  if (missing.empty()) return "";
  return std::string(device_type_name(t)) + " registers no kernel " + missing;
}

// A check by its index in all_checks(); gtest prints it by name.
struct CheckRef {
  size_t index;
};
void PrintTo(const CheckRef& r, std::ostream* os) { *os << all_checks()[r.index].name; }

class Conformance : public ::testing::TestWithParam<CheckRef> {};

TEST_P(Conformance, Check) {
  const Check& ch = all_checks()[GetParam().index];
  if (ch.kind == Kind::kNoBackend) GTEST_SKIP() << ch.message;
  if (ch.kind == Kind::kBadCase) FAIL() << ch.message;
  const Case& c = ch.c;
  const std::string base = ch.op + "__" + c.name;
  const uint64_t seed = seed_of(base);
  SCOPED_TRACE(base + ", inputs seeded " + std::to_string(seed));
  switch (ch.kind) {
    case Kind::kBadCase:
    case Kind::kNoBackend:
      return;
    case Kind::kGradcheck: {
      for (const std::string& k : c.kernels) {
        ASSERT_TRUE(kernels::Registry::instance().has(k, DeviceType::kCpu))
            << "the case names kernel " << k << ", which the CPU does not register";
      }
      Generator gen(seed);
      const Inputs in = c.inputs(gen);
      testing::expect_gradcheck(as_one_output(c), in, c.grad.eps, c.grad.atol, c.grad.rtol,
                                c.grad.max_probes);
      return;
    }
    case Kind::kCpuF32: {
      Generator gen(seed);
      const Inputs in = c.inputs(gen);
      testing::expect_f32_matches_f64(as_one_output(c), in, c.tol.cpu_f32);
      if (!c.dtypes.empty()) compare(c, seed, Device::cpu(), DType::kF32, /*offset=*/true);
      return;
    }
    case Kind::kBackend: {
      const std::string reason = unavailable(c, ch.backend);
      if (!reason.empty()) GTEST_SKIP() << reason;
      for (DType dt : c.dtypes) {
        for (bool offset : {false, true}) compare(c, seed, Device{ch.backend, 0}, dt, offset);
      }
      return;
    }
  }
}

std::vector<CheckRef> all_refs() {
  std::vector<CheckRef> refs;
  for (size_t i = 0; i < all_checks().size(); ++i) refs.push_back({i});
  return refs;
}

INSTANTIATE_TEST_SUITE_P(Table, Conformance, ::testing::ValuesIn(all_refs()),
                         [](const ::testing::TestParamInfo<CheckRef>& info) {
                           return all_checks()[info.param.index].name;
                         });

}  // namespace
}  // namespace loom::conformance
