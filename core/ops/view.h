// core/ops/view.h — differentiable views and layout changes. Views share storage with their
// input (reshape copies only when the input's strides cannot express the new shape).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace loom::ops {

// One dimension of `shape` may be -1 (inferred).
Tensor reshape(const Tensor& x, Shape shape);
Tensor view(const Tensor& x, Shape shape);  // errors instead of copying
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// Size-1 dims (or new leading dims) broadcast to `shape` with stride 0; backward sums them.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);  // always a fresh contiguous copy
Tensor to_dtype(const Tensor& x, DType dtype);
Tensor to_device(const Tensor& x, Device device);

// Concatenation along `dim`, and its inverse (sizes along `dim` must sum to x.size(dim)).
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// Copies src into dst (same shape; any strides and dtypes). Not differentiable.
void copy_(Tensor& dst, const Tensor& src);

}  // namespace loom::ops
