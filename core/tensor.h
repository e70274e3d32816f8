// core/tensor.h — Tensor: a shared Storage seen through shape, strides and offset, plus the
// autograd fields (requires_grad, grad, grad_fn). Copying a Tensor copies a handle; views share
// storage. Differentiable operations live in core/ops/ and are free functions; the members here
// are metadata, raw data access, and thin forwards to those ops.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/param_role.h"
#include "core/placement.h"
#include "core/storage.h"

namespace loom {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

class Tensor;
namespace autograd {
class Node;
}

// A hook run when a leaf's gradient for the current backward is final (see core/autograd.h).
using GradReadyHook = std::function<void(Tensor& leaf)>;
// A hook offered each contribution to a leaf's gradient that arrives while others are still to
// come in this backward (a leaf used several times: Note [Partial gradients] in
// core/autograd.h). Returns true when it took the contribution: the engine then adds it
// nowhere.
using GradPartialHook = std::function<bool(Tensor& leaf, const Tensor& contribution)>;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::kF32;
  Device device;

  // Autograd.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;           // null for leaves
  int output_nr = 0;                                 // which output of grad_fn this is
  std::shared_ptr<autograd::Node> grad_accumulator;  // leaves only, created on first use
  std::vector<GradReadyHook> hooks;                  // leaves only
  std::vector<GradPartialHook> partial_hooks;        // leaves only

  // Where these values sit in a parallel layout (core/placement.h); null: the whole tensor.
  std::shared_ptr<const Placement> placement;
  // What a parameter is in its model (core/param_role.h); null: not a model's parameter.
  std::shared_ptr<const ParamRole> role;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories (contiguous). Random factories are in core/rng.h.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = {});
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = {});
  static Tensor ones(const Shape& shape, DType dtype = DType::kF32, Device device = {});
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     Device device = {});
  static Tensor scalar(double value, DType dtype = DType::kF32, Device device = {});
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  static Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
  static Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  // Raw data at this tensor's offset. data<T>() checks that T matches the dtype.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    LOOM_CHECK(DTypeOf<T>::value == dtype(), "data<", dtype_name(DTypeOf<T>::value), ">() on a ",
               dtype_name(dtype()), " tensor");
    return static_cast<T*>(raw_data());
  }
  // Reads one element as double (CPU only; for tests and logging, not hot paths).
  double item() const;
  double at(const std::vector<int64_t>& index) const;
  std::vector<double> to_vector() const;  // CPU, any layout, in logical order

  // Autograd.
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  void zero_grad() { impl_->grad.reset(); }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl_->grad_fn; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  // Note [Placement] in core/placement.h: set by whoever shards or copies a parameter, kept by
  // this handle (not by views). Unset, the tensor is whole: global shape = shape, held once.
  Placement placement() const;
  void set_placement(Placement p);
  bool has_placement() const { return impl_->placement != nullptr; }
  // core/param_role.h: set by the model that registers the parameter; null when none did.
  const ParamRole* role() const { return impl_->role.get(); }
  void set_role(ParamRole r) { impl_->role = std::make_shared<const ParamRole>(std::move(r)); }
  // A new handle to the same data with no autograd history (shares storage).
  Tensor detach() const;
  // Registers a hook that fires when this leaf's gradient is final in a backward pass.
  void register_grad_ready_hook(GradReadyHook hook);
  // Registers a hook offered this leaf's early contributions (Note [Partial gradients]).
  void register_grad_partial_hook(GradPartialHook hook);

  // Forwards to differentiable ops in core/ops/ (see there for semantics).
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;  // like reshape but never copies (errors instead)
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor expand(const Shape& shape) const;
  Tensor contiguous() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor clone() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Builds a view of `base` (shared storage) with new geometry; no autograd history.
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

// Wraps the dimension index d (negative counts from the end) and checks it against ndim.
int64_t wrap_dim(int64_t d, int64_t ndim, const char* op);

}  // namespace loom
