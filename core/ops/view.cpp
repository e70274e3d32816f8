// core/ops/view.cpp — views, layout changes, cat/split and their backward rules.
#include "core/ops/view.h"

#include <numeric>

#include "core/autograd.h"
#include "core/ops/reduce.h"
#include "kernels/copy.h"

namespace loom::ops {

using autograd::record_function;

namespace {

Shape infer_shape(const Tensor& x, Shape shape) {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LOOM_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    LOOM_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 in ",
               shape_str(shape), " for ", x.numel(), " elements");
    shape[infer] = x.numel() / known;
  }
  LOOM_CHECK(shape_numel(shape) == x.numel(), "reshape: ", shape_str(x.shape()), " (", x.numel(),
             " elements) cannot become ", shape_str(shape));
  return shape;
}

// Strides that let x's storage be read as `shape` without a copy, if there are any. The
// source dims fall into runs that are contiguous with each other ("chunks"); every chunk must be
// covered exactly by a run of target dims.
bool view_strides(const Tensor& x, const Shape& shape, Shape& out) {
  if (x.is_contiguous() || x.numel() == 0) {
    out = contiguous_strides(shape);
    return true;
  }
  struct Chunk {
    int64_t numel;
    int64_t stride;  // of its innermost dim
  };
  std::vector<Chunk> chunks;  // innermost first
  for (int64_t i = x.dim() - 1; i >= 0; --i) {
    const int64_t size = x.shape()[i], stride = x.strides()[i];
    if (size == 1) continue;
    if (!chunks.empty() && stride == chunks.back().stride * chunks.back().numel) {
      chunks.back().numel *= size;
    } else {
      chunks.push_back({size, stride});
    }
  }
  out.assign(shape.size(), 1);
  size_t c = 0;
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (c >= chunks.size()) return false;
    out[i] = chunks[c].stride * acc;
    acc *= shape[i];
    if (acc == chunks[c].numel) {
      ++c;
      acc = 1;
    } else if (chunks[c].numel % acc != 0) {
      return false;
    }
  }
  return c == chunks.size();
}

}  // namespace

Tensor view(const Tensor& x, Shape shape) {
  shape = infer_shape(x, std::move(shape));
  Shape strides;
  LOOM_CHECK(view_strides(x, shape, strides), "view: ", shape_str(x.shape()), " with strides ",
             shape_str(x.strides()), " cannot be viewed as ", shape_str(shape),
             " without a copy (use reshape)");
  Tensor y = make_view(x, shape, strides, x.offset());
  if (autograd::needs_grad({&x})) {
    Shape in_shape = x.shape();
    record_function("view", {x}, {&y}, [in_shape](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{reshape(g[0], in_shape)};
    });
  }
  return y;
}

Tensor reshape(const Tensor& x, Shape shape) {
  shape = infer_shape(x, std::move(shape));
  Shape strides;
  if (view_strides(x, shape, strides)) return view(x, shape);
  return view(contiguous(x), shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  LOOM_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: ", dims.size(), " dims for a ",
             x.dim(), "-d tensor");
  Shape shape(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], x.dim(), "permute");
    LOOM_CHECK(inverse[d] < 0, "permute: dim ", d, " repeated");
    inverse[d] = static_cast<int64_t>(i);
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  Tensor y = make_view(x, shape, strides, x.offset());
  if (autograd::needs_grad({&x})) {
    record_function("permute", {x}, {&y}, [inverse](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{permute(g[0], inverse)};
    });
  }
  return y;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, x.dim(), "transpose")], dims[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, dims);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  dim = wrap_dim(dim, x.dim(), "narrow");
  LOOM_CHECK(start >= 0 && length >= 0 && start + length <= x.size(dim), "narrow: [", start, ", ",
             start + length, ") out of range for size ", x.size(dim), " of dim ", dim);
  Shape shape = x.shape();
  shape[dim] = length;
  Tensor y = make_view(x, shape, x.strides(), x.offset() + start * x.stride(dim));
  if (autograd::needs_grad({&x})) {
    Shape in_shape = x.shape();
    DType dt = x.dtype();
    Device dev = x.device();
    record_function("narrow", {x}, {&y}, [=](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::zeros(in_shape, dt, dev);
      Tensor slot = make_view(dx, g[0].shape(), dx.strides(), start * dx.strides()[dim]);
      copy_(slot, g[0]);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  LOOM_CHECK(static_cast<int64_t>(shape.size()) >= x.dim(), "expand: ", shape_str(x.shape()),
             " has more dims than ", shape_str(shape));
  const size_t lead = shape.size() - x.shape().size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    const int64_t s = x.shape()[i];
    LOOM_CHECK(s == shape[lead + i] || s == 1, "expand: ", shape_str(x.shape()),
               " cannot broadcast to ", shape_str(shape));
    strides[lead + i] = s == 1 && shape[lead + i] != 1 ? 0 : x.strides()[i];
  }
  Tensor y = make_view(x, shape, strides, x.offset());
  if (autograd::needs_grad({&x})) {
    Shape in_shape = x.shape();
    record_function("expand", {x}, {&y}, [in_shape](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to_shape(g[0], in_shape)};
    });
  }
  return y;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + dim, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "squeeze");
  LOOM_CHECK(x.size(dim) == 1, "squeeze: dim ", dim, " has size ", x.size(dim));
  Shape s = x.shape();
  s.erase(s.begin() + dim);
  return reshape(x, s);
}

void copy_(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  kernels::call_kernel<kernels::copy_k>(src, dst);
}

Tensor clone(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_(y, x);
  if (autograd::needs_grad({&x})) {
    record_function("clone", {x}, {&y},
                    [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  }
  return y;
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  copy_(y, x);
  if (autograd::needs_grad({&x}) && is_floating(dtype)) {
    DType in = x.dtype();
    record_function("to_dtype", {x}, {&y}, [in](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{to_dtype(g[0], in)};
    });
  }
  return y;
}

namespace {
Tensor transfer(const Tensor& x, Device device) {
  Tensor src = contiguous(x.detach());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  if (y.numel() == 0) return y;
  if (device.is_cpu()) {
    kernels::find_kernel<kernels::copy_device_to_host_k>(x.device().type)(src, y);
  } else {
    LOOM_CHECK(x.device().is_cpu(), "to_device: ", x.device().str(), " → ", device.str(),
               " must go through the host");
    kernels::find_kernel<kernels::copy_host_to_device_k>(device.type)(src, y);
  }
  return y;
}
}  // namespace

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor y = transfer(x, device);
  if (autograd::needs_grad({&x})) {
    Device in = x.device();
    record_function("to_device", {x}, {&y}, [in](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{transfer(g[0], in)};
    });
  }
  return y;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  LOOM_CHECK(!xs.empty(), "cat: no tensors");
  dim = wrap_dim(dim, xs[0].dim(), "cat");
  Shape shape = xs[0].shape();
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const Tensor& x : xs) {
    LOOM_CHECK(x.dim() == xs[0].dim() && x.dtype() == xs[0].dtype(),
               "cat: tensors differ in rank or dtype");
    for (int64_t d = 0; d < x.dim(); ++d) {
      LOOM_CHECK(d == dim || x.size(d) == shape[d], "cat: ", shape_str(x.shape()), " and ",
                 shape_str(shape), " differ outside dim ", dim);
    }
    sizes.push_back(x.size(dim));
    total += x.size(dim);
  }
  shape[dim] = total;
  Tensor y = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
  int64_t at = 0;
  for (const Tensor& x : xs) {
    Tensor slot = make_view(y, x.shape(), y.strides(), at * y.strides()[dim]);
    copy_(slot, x);
    at += x.size(dim);
  }
  if (autograd::needs_grad(xs)) {
    record_function("cat", xs, {&y},
                    [sizes, dim](const std::vector<Tensor>& g) { return split(g[0], sizes, dim); });
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "split");
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  LOOM_CHECK(total == x.size(dim), "split: sizes sum to ", total, " but dim ", dim, " has ",
             x.size(dim));
  std::vector<Tensor> outs;
  int64_t at = 0;
  for (int64_t s : sizes) {
    Shape shape = x.shape();
    shape[dim] = s;
    outs.push_back(make_view(x, shape, x.strides(), x.offset() + at * x.stride(dim)));
    at += s;
  }
  if (autograd::needs_grad({&x})) {
    std::vector<Tensor*> out_ptrs;
    for (Tensor& o : outs) out_ptrs.push_back(&o);
    Shape in_shape = x.shape();
    DType dt = x.dtype();
    Device dev = x.device();
    record_function("split", {x}, out_ptrs, [=](const std::vector<Tensor>& g) {
      std::vector<Tensor> parts;
      for (size_t i = 0; i < g.size(); ++i) {
        Shape s = in_shape;
        s[dim] = sizes[i];
        parts.push_back(g[i].defined() ? g[i] : Tensor::zeros(s, dt, dev));
      }
      return std::vector<Tensor>{cat(parts, dim)};
    });
  }
  return outs;
}

}  // namespace loom::ops
