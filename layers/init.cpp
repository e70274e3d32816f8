// layers/init.cpp — parameter initialisers (see layers/init.h).
#include "layers/init.h"

#include "core/autograd.h"
#include "core/ops/view.h"

namespace loom::init {

void normal_(const Tensor& p, Generator& gen, double std) {
  autograd::NoGradGuard no_grad;
  Tensor dst = p;
  ops::copy_(dst, randn(p.shape(), gen, p.dtype(), 0.0, std, p.device()));
}

void fill_(const Tensor& p, double value) {
  autograd::NoGradGuard no_grad;
  Tensor dst = p;
  ops::copy_(dst, Tensor::full(p.shape(), value, p.dtype(), p.device()));
}

void zero_rows_from_(const Tensor& p, int64_t begin) {
  LOOM_CHECK(p.dim() == 2 && begin >= 0 && begin <= p.size(0), "init::zero_rows_from_: row ", begin,
             " outside ", shape_str(p.shape()));
  if (begin == p.size(0)) return;
  autograd::NoGradGuard no_grad;
  Tensor rows = ops::narrow(p, 0, begin, p.size(0) - begin);
  ops::copy_(rows, Tensor::zeros(rows.shape(), p.dtype(), p.device()));
}

}  // namespace loom::init
