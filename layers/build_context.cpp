// layers/build_context.cpp — the single-device capabilities of a LayerContext (see
// layers/build_context.h): plain Linear and Embedding layers, identity region ops, the fused
// causal attention and cross-entropy ops, and a layout in which this rank holds every token.
#include "layers/build_context.h"

#include <numeric>

#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/linear.h"

namespace loom {

namespace {

class SingleDeviceLinear final : public LinearFactory {
 public:
  int feature_split() const override { return 1; }
  std::unique_ptr<LinearLayer> column(int64_t in, const std::vector<int64_t>& segments, bool bias,
                                      DType dtype, Device device) const override {
    const int64_t out = std::accumulate(segments.begin(), segments.end(), int64_t{0});
    return std::make_unique<Linear>(in, out, bias, dtype, device);
  }
  std::unique_ptr<LinearLayer> row(int64_t in, int64_t out, bool bias, DType dtype,
                                   Device device) const override {
    return std::make_unique<Linear>(in, out, bias, dtype, device);
  }
  std::unique_ptr<EmbeddingLayer> vocab_embedding(int64_t rows, int64_t dim, DType dtype,
                                                  Device device) const override {
    return std::make_unique<Embedding>(rows, dim, dtype, device);
  }
  Tensor replicated_param(const Tensor& p) const override { return p; }
  Tensor head_param(const Tensor& p) const override { return p; }
  Tensor column_input(const Tensor& x) const override { return x; }
};

class SingleDeviceLayout final : public SequenceLayout {
 public:
  Tensor local_sequence(const Tensor& x, int64_t) const override { return x; }
  Tensor local_positions(int64_t) const override { return Tensor(); }
  Tensor row_positions(const Tensor& positions) const override { return positions; }
  Tensor dropout_rows(const Tensor&) const override { return Tensor(); }
  int64_t sequence_length(int64_t local_tokens) const override { return local_tokens; }
  int64_t local_tokens(int64_t rows) const override { return rows; }
};

}  // namespace

std::unique_ptr<LinearLayer> LinearFactory::mlp_in(int64_t, int64_t in, int64_t hidden, bool bias,
                                                   DType dtype, Device device) const {
  return column(in, {hidden}, bias, dtype, device);
}

std::unique_ptr<LinearLayer> LinearFactory::mlp_out(int64_t, int64_t hidden, int64_t out, bool bias,
                                                    DType dtype, Device device) const {
  return row(hidden, out, bias, dtype, device);
}

std::unique_ptr<LinearLayer> LinearFactory::attn_in(int64_t, int64_t in,
                                                    const std::vector<int64_t>& segments, bool bias,
                                                    DType dtype, Device device) const {
  return column(in, segments, bias, dtype, device);
}

std::unique_ptr<LinearLayer> LinearFactory::attn_out(int64_t, int64_t in, int64_t out, bool bias,
                                                     DType dtype, Device device) const {
  return row(in, out, bias, dtype, device);
}

std::shared_ptr<const LinearFactory> single_device_linear() {
  static const std::shared_ptr<const LinearFactory> kLinear =
      std::make_shared<const SingleDeviceLinear>();
  return kLinear;
}

std::shared_ptr<const SequenceLayout> single_device_layout() {
  static const std::shared_ptr<const SequenceLayout> kLayout =
      std::make_shared<const SingleDeviceLayout>();
  return kLayout;
}

Tensor single_device_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& doc_start) {
  return ops::causal_attention(q, k, v, 0.0, doc_start);
}

Tensor single_device_loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                          int64_t vocab_size) {
  const Tensor host_targets = targets.device().is_cpu() ? targets : Tensor();
  return ops::softmax_cross_entropy(logits, targets.to(logits.device()), ignore_index, vocab_size,
                                    host_targets);
}

}  // namespace loom
