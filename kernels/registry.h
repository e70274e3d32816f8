// kernels/registry.h — the kernel table: one function per (kernel name, device type).
//
// A kernel is declared once, with its signature, in kernels/<op>.h:
//     LOOM_DECLARE_KERNEL(gelu_forward, void(const Tensor& x, Tensor& y));
// implemented per backend and registered next to its definition:
//     LOOM_REGISTER_KERNEL(gelu_forward, kCpu, gelu_forward_cpu);
// and called by the op front-end, dispatching on the first tensor argument's device:
//     call_kernel<gelu_forward_k>(x, y);
// Signatures are checked at compile time on both sides. A miss throws
// "gelu_forward: no kernel for cuda". See Note [Process-wide registries] in core/allocator.h.
#pragma once

#include <string>
#include <typeindex>
#include <vector>

#include "core/tensor.h"

namespace loom::kernels {

class Registry {
 public:
  static Registry& instance();
  void add(const std::string& name, DeviceType device, std::type_index sig, void* fn);
  void* find(const std::string& name, DeviceType device, std::type_index sig) const;
  bool has(const std::string& name, DeviceType device) const;
  std::vector<std::string> names(DeviceType device) const;

 private:
  struct Entry {
    std::string name;
    DeviceType device;
    std::type_index sig;
    void* fn;
  };
  std::vector<Entry> entries_;
};

struct Registrar {
  Registrar(const char* name, DeviceType device, std::type_index sig, void* fn) {
    Registry::instance().add(name, device, sig, fn);
  }
};

template <typename K>
typename K::Fn* find_kernel(DeviceType device) {
  return reinterpret_cast<typename K::Fn*>(
      Registry::instance().find(K::kName, device, typeid(typename K::Fn)));
}

namespace detail {
inline void collect(std::vector<const Tensor*>&) {}
template <typename A, typename... Rest>
void collect(std::vector<const Tensor*>& out, const A& a, const Rest&... rest) {
  if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) {
    if (a.defined()) out.push_back(&a);
  }
  collect(out, rest...);
}
}  // namespace detail

// Dispatches on the device of the first defined tensor argument; all tensor arguments must share
// it.
template <typename K, typename... Args>
void call_kernel(Args&&... args) {
  std::vector<const Tensor*> ts;
  detail::collect(ts, args...);
  LOOM_CHECK(!ts.empty(), K::kName, ": no tensor argument");
  const Device dev = ts[0]->device();
  for (const Tensor* t : ts) {
    LOOM_CHECK(t->device() == dev, K::kName, ": tensors on different devices (", dev.str(), " and ",
               t->device().str(), ")");
  }
  find_kernel<K>(dev.type)(std::forward<Args>(args)...);
}

}  // namespace loom::kernels

#define LOOM_DECLARE_KERNEL(name, ...)          \
  namespace loom::kernels {                     \
  struct name##_k {                             \
    using Fn = __VA_ARGS__;                     \
    static constexpr const char* kName = #name; \
  };                                            \
  }

#define LOOM_REGISTER_KERNEL(name, device, fn)                                  \
  static ::loom::kernels::Registrar loom_registrar_##name##_##device(           \
      #name, ::loom::DeviceType::device, typeid(::loom::kernels::name##_k::Fn), \
      reinterpret_cast<void*>(static_cast<::loom::kernels::name##_k::Fn*>(&fn)))
