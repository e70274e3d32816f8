// core/tensor.cpp — Tensor construction, geometry and raw access. Differentiable views are in
// core/ops/view.cpp; the members that forward there are defined at the end of this file.
#include "core/tensor.h"

#include <sstream>

#include "core/autograd.h"
#include "core/ops/view.h"
#include "kernels/copy.h"

namespace loom {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    LOOM_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n), "shape ", shape_str(s),
               " has a negative size or more elements than int64 counts");
  }
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t w = d < 0 ? d + ndim : d;
  LOOM_CHECK(w >= 0 && w < ndim, op, ": dim ", d, " out of range for a ", ndim, "-d tensor");
  return w;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) LOOM_CHECK(d >= 0, "empty: negative size in shape ", shape_str(shape));
  int64_t bytes = 0;
  LOOM_CHECK(
      !__builtin_mul_overflow(shape_numel(shape), static_cast<int64_t>(dtype_size(dtype)), &bytes),
      "empty: a ", dtype_name(dtype), " tensor of shape ", shape_str(shape),
      " has more bytes than int64 counts");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) kernels::call_kernel<kernels::fill_k>(t, value);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "from_vector: ", values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DTypeOf<T>::value);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}
template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<int32_t>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<uint16_t>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<uint32_t>&, const Shape&);

int64_t Tensor::size(int64_t d) const { return impl_->shape[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  LOOM_CHECK(!impl_->storage->released(),
             "tensor data was released (a ZeRO-3 parameter read outside its unit's gather; "
             "Note [Releasable storage] in core/storage.h)");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * dtype_size(impl_->dtype);
}

std::vector<double> Tensor::to_vector() const {
  LOOM_CHECK(device().is_cpu(), "to_vector: tensor is on ", device().str());
  Tensor c = Tensor::empty(shape(), DType::kF64);
  if (numel() > 0) kernels::call_kernel<kernels::copy_k>(*this, c);
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

double Tensor::item() const {
  LOOM_CHECK(numel() == 1, "item: tensor has ", numel(), " elements, expected 1");
  return to(Device::cpu()).to_vector()[0];
}

double Tensor::at(const std::vector<int64_t>& index) const {
  LOOM_CHECK(static_cast<int64_t>(index.size()) == dim(), "at: ", index.size(), " indices for a ",
             dim(), "-d tensor");
  int64_t off = 0;
  for (size_t i = 0; i < index.size(); ++i) {
    LOOM_CHECK(index[i] >= 0 && index[i] < impl_->shape[i], "at: index out of range");
    off += index[i] * impl_->strides[i];
  }
  return make_view(*this, {}, {}, impl_->offset + off).item();
}

Placement Tensor::placement() const {
  if (impl_->placement) return *impl_->placement;
  Placement p;
  p.global_shape = shape();
  return p;
}

void Tensor::set_placement(Placement p) {
  LOOM_CHECK(p.global_shape.size() == shape().size(), "set_placement: global shape ",
             shape_str(p.global_shape), " has another rank than the tensor's ", shape_str(shape()));
  for (const PlacementSplit& s : p.splits) {
    LOOM_CHECK(s.dim >= 0 && s.dim < dim(), "set_placement: split dim ", s.dim, " of a ", dim(),
               "-d tensor");
    int64_t held = 0;
    for (const PlacementRun& r : s.runs) {
      LOOM_CHECK(r.local >= 0 && r.local + r.length <= size(s.dim) && r.global >= 0 &&
                     r.global + r.length <= p.global_shape[static_cast<size_t>(s.dim)],
                 "set_placement: run ", r.local, "→", r.global, " (", r.length, ") outside dim ",
                 s.dim, " of ", shape_str(shape()), " / global ", shape_str(p.global_shape));
      held += r.length;
    }
    LOOM_CHECK(held == size(s.dim), "set_placement: the runs of dim ", s.dim, " hold ", held,
               " of its ", size(s.dim), " indices");
  }
  for (int64_t d = 0; d < dim(); ++d) {
    bool split = false;
    for (const PlacementSplit& s : p.splits) split = split || s.dim == d;
    LOOM_CHECK(split || size(d) == p.global_shape[static_cast<size_t>(d)], "set_placement: dim ", d,
               " is not split but ", shape_str(shape()), " differs from the global ",
               shape_str(p.global_shape));
  }
  impl_->placement = std::make_shared<const Placement>(std::move(p));
}

Tensor& Tensor::set_requires_grad(bool r) {
  LOOM_CHECK(!r || is_floating(dtype()), "requires_grad on a ", dtype_name(dtype()), " tensor");
  LOOM_CHECK(is_leaf(), "set_requires_grad: only leaves (tensors with no history) can be set");
  impl_->requires_grad = r;
  return *this;
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

void Tensor::register_grad_ready_hook(GradReadyHook hook) {
  LOOM_CHECK(is_leaf() && requires_grad(),
             "register_grad_ready_hook: only on leaves that require grad");
  impl_->hooks.push_back(std::move(hook));
}

void Tensor::register_grad_partial_hook(GradPartialHook hook) {
  LOOM_CHECK(is_leaf() && requires_grad(),
             "register_grad_partial_hook: only on leaves that require grad");
  impl_->partial_hooks.push_back(std::move(hook));
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->device = base.device();
  return Tensor(std::move(impl));
}

Tensor Tensor::reshape(const Shape& s) const { return ops::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return ops::view(*this, s); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return ops::transpose(*this, d0, d1); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return ops::permute(*this, dims); }
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t len) const {
  return ops::narrow(*this, d, start, len);
}
Tensor Tensor::expand(const Shape& s) const { return ops::expand(*this, s); }
Tensor Tensor::contiguous() const { return ops::contiguous(*this); }
Tensor Tensor::to(Device d) const { return ops::to_device(*this, d); }
Tensor Tensor::to(DType t) const { return ops::to_dtype(*this, t); }
Tensor Tensor::clone() const { return ops::clone(*this); }

}  // namespace loom
