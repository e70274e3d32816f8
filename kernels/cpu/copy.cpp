// kernels/cpu/copy.cpp — CPU strided copy with dtype conversion, and fill.
#include "kernels/copy.h"

#include <cstring>

#include "kernels/cpu/parallel.h"

namespace loom::kernels::cpu {
namespace {

void copy_cpu(const Tensor& src, Tensor& dst) {
  LOOM_CHECK(src.shape() == dst.shape(), "copy: shapes ", shape_str(src.shape()), " and ",
             shape_str(dst.shape()), " differ");
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    const size_t bytes = src.nbytes();
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(dst.raw_data());
    parallel_for(static_cast<int64_t>(bytes), int64_t{1} << 20, [&](int64_t b, int64_t e) {
      std::memcpy(d + b, s + b, static_cast<size_t>(e - b));
    });
    return;
  }
  LOOM_DISPATCH_ALL(src.dtype(), "copy", [&] {
    using src_t = scalar_t;
    const src_t* s = static_cast<const src_t*>(src.raw_data());
    LOOM_DISPATCH_ALL(dst.dtype(), "copy", [&] {
      scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
      strided_for<2>(src.shape(), {&src.strides(), &dst.strides()},
                     [&](int64_t os, int64_t od) { d[od] = convert<scalar_t>(s[os]); });
    });
  });
}

void fill_cpu(Tensor& dst, double value) {
  LOOM_DISPATCH_ALL(dst.dtype(), "fill", [&] {
    scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
    const scalar_t v = convert<scalar_t>(value);
    if (dst.is_contiguous()) {
      parallel_for(dst.numel(), kElementGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = v;
      });
    } else {
      strided_for<1>(dst.shape(), {&dst.strides()}, [&](int64_t o) { d[o] = v; });
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(copy, kCpu, copy_cpu);
LOOM_REGISTER_KERNEL(fill, kCpu, fill_cpu);

}  // namespace loom::kernels::cpu
