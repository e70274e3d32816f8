// layers/module.cpp — parameter and child registries of Module (see layers/module.h).
#include "layers/module.h"

#include "core/error.h"
#include "core/ops/view.h"

namespace loom {

namespace {
void check_name(const std::string& name, const char* what) {
  LOOM_CHECK(!name.empty(), "Module::", what, ": empty name");
}
}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name(name, "register_parameter");
  LOOM_CHECK(t.defined(), "Module::register_parameter: '", name, "' is undefined");
  LOOM_CHECK(t.is_leaf(), "Module::register_parameter: '", name, "' is not a leaf tensor");
  LOOM_CHECK(is_floating(t.dtype()), "Module::register_parameter: '", name, "' has dtype ",
             dtype_name(t.dtype()), "; parameters must be floating");
  for (const auto& [n, p] : params_) {
    LOOM_CHECK(n != name, "Module::register_parameter: '", name, "' registered twice");
  }
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

Module& Module::register_module(const std::string& name, Module& child) {
  check_name(name, "register_module");
  LOOM_CHECK(&child != this, "Module::register_module: '", name, "' is the module itself");
  for (const auto& [n, c] : children_) {
    LOOM_CHECK(n != name, "Module::register_module: '", name, "' registered twice");
  }
  child.train(training_);
  child.set_compute_dtype(compute_dtype_);
  children_.emplace_back(name, &child);
  return child;
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

Tensor Module::parameter(const std::string& name) const {
  for (auto& [n, t] : named_parameters()) {
    if (n == name) return t;
  }
  LOOM_FAIL("Module::parameter: no parameter named '", name, "'");
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::for_each_module(const std::function<void(const Module&)>& fn) const {
  fn(*this);
  for (const auto& [name, child] : children_) child->for_each_module(fn);
}

void Module::set_compute_dtype(std::optional<DType> dtype) {
  LOOM_CHECK(!dtype || is_floating(*dtype), "Module::set_compute_dtype: ", dtype_name(*dtype),
             " is not a floating dtype");
  compute_dtype_ = dtype;
  for (auto& [name, child] : children_) child->set_compute_dtype(dtype);
}

Tensor Module::compute(const Tensor& t) const {
  if (!compute_dtype_ || !t.defined() || t.dtype() == *compute_dtype_) return t;
  return ops::to_dtype(t, *compute_dtype_);
}

void Module::zero_grad() {
  for (auto& [name, t] : named_parameters()) t.zero_grad();
}

}  // namespace loom
