// kernels/registry.cpp — the kernel table (filled at static-initialisation time, then read-only).
#include "kernels/registry.h"

#include <algorithm>

namespace loom::kernels {

Registry& Registry::instance() {
  static Registry r;
  return r;
}

void Registry::add(const std::string& name, DeviceType device, std::type_index sig, void* fn) {
  for (const Entry& e : entries_) {
    LOOM_CHECK(!(e.name == name && e.device == device), "kernel ", name, " registered twice for ",
               device_type_name(device));
  }
  entries_.push_back({name, device, sig, fn});
}

void* Registry::find(const std::string& name, DeviceType device, std::type_index sig) const {
  for (const Entry& e : entries_) {
    if (e.name == name && e.device == device) {
      LOOM_CHECK(e.sig == sig, name, ": kernel registered for ", device_type_name(device),
                 " with a different signature");
      return e.fn;
    }
  }
  LOOM_FAIL(name, ": no kernel for ", device_type_name(device));
}

bool Registry::has(const std::string& name, DeviceType device) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return e.name == name && e.device == device; });
}

std::vector<std::string> Registry::names(DeviceType device) const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) {
    if (e.device == device) out.push_back(e.name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace loom::kernels
