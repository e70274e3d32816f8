// parallel/pp/pipeline.cpp — TransformerPipeline (see parallel/pp/pipeline.h).
#include "parallel/pp/pipeline.h"

#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "layers/block.h"
#include "parallel/pp/partition.h"

namespace loom::parallel::pp {

namespace {

constexpr int kTiedTag = 32767;  // above every message_tag() of a step

// Sends `mine` to `peer` and receives `theirs` from it, as one group (both ranks send first).
void exchange(Communicator& g, const Tensor& mine, const Tensor& theirs, int peer) {
  for (WorkPtr& w :
       g.send_recv_async({P2P::send(mine, peer, kTiedTag), P2P::recv(theirs, peer, kTiedTag)})) {
    w->wait();
  }
}
constexpr int kEvalTag = 32766;  // validation activations; no step message is in flight then

}  // namespace

TransformerPipeline::TransformerPipeline(const Transformer& model, Communicator& pp,
                                         const PipelineOptions& options, int64_t batch,
                                         int64_t seq_len)
    : model_(model),
      pp_(pp),
      options_(options),
      shape_(schedule_shape(options.schedule, pp.size(), options.vpp, options.microbatches)),
      batch_(batch),
      seq_len_(seq_len),
      boundaries_(partition_layers(model.num_blocks(), pp.size() * options.vpp, options.layout)),
      costs_(options.costs.costs(shape_)),
      executor_(pp, options.schedule, shape_,
                {batch, options.activation_rows > 0 ? options.activation_rows : seq_len,
                 model.config().n_embd},  // what crosses stages
                model.compute_dtype().value_or(model.dtype()), model.device(), costs_) {
  validate_schedule_costs(options.schedule, options.costs);
  const bool tied = model.config().tie_embeddings;
  for (auto& [name, t] : model.named_parameters()) {
    const bool table = t.impl() == model.wte_weight().impl();  // the model says which
    if (table) table_name_ = name;
    // The rank of each stage: Note [Pipeline stages and chunks] in parallel/pp/schedule.h.
    for (int g : stages_of_parameter(name, t, boundaries_, tied && table)) {
      if (shape_.stage_rank(g) == pp.rank()) {
        params_.emplace_back(name, t);
        break;
      }
    }
  }
  for (auto& [name, t] : params_) {  // Note [Placement]: the copy is neither counted nor saved
    if (!is_tied_copy(name)) continue;
    Placement p = t.placement();
    p.tied_to = name;
    t.set_placement(std::move(p));
  }
}

bool TransformerPipeline::tied_shared() const {
  // Two ranks hold the table; where one rank holds the first and the last stage (zb-v's V, or
  // p = 1) both use the same tensor and its gradient sums both parts.
  return model_.config().tie_embeddings && shape_.stage_rank(0) != last_stage_rank();
}

bool TransformerPipeline::is_tied_copy(const std::string& name) const {
  return tied_shared() && pp_.rank() == last_stage_rank() && is_tied_table(name);
}

bool TransformerPipeline::is_tied_table(const std::string& name) const {
  return name == table_name_;
}

int64_t TransformerPipeline::release_other_stages(Transformer& model) const {
  LOOM_CHECK(&model == &model_, "pipeline: release_other_stages needs the pipeline's own model");
  std::set<std::string> mine;
  for (const auto& [name, t] : params_) mine.insert(name);
  const Tensor placeholder = Tensor::zeros({1}, model.dtype(), model.device());
  int64_t freed = 0;
  for (auto [name, t] : model.named_parameters()) {  // handles share the parameter's TensorImpl
    if (mine.count(name)) continue;
    t.set_requires_grad(false);
    TensorImpl* impl = t.impl();
    impl->storage = placeholder.storage();
    impl->offset = placeholder.offset();
    impl->strides.assign(impl->shape.size(), 0);
    freed += t.numel();
  }
  return freed;
}

Tensor TransformerPipeline::forward_backward(const std::vector<Tensor>& inputs,
                                             const std::vector<Tensor>& targets,
                                             const DropoutKey* dropout,
                                             const std::function<void(bool)>& before_backward,
                                             const Tensor& grad_scale) {
  const int m = shape_.microbatches, last = shape_.num_global_stages() - 1;
  LOOM_CHECK(static_cast<int>(inputs.size()) == m && static_cast<int>(targets.size()) == m,
             "pipeline: ", inputs.size(), " input and ", targets.size(),
             " target micro-batches, expected ", m);
  const Tensor pos = options_.positions.defined() ? options_.positions : model_.positions(seq_len_);
  ChunkCallbacks cb;
  cb.forward = [&](int mb, int chunk, const Tensor& input) {
    const int g = shape_.global_stage(pp_.rank(), chunk);
    const Tensor& ids = inputs[static_cast<size_t>(mb)];
    LOOM_CHECK(ids.dim() == 2 && ids.size(0) == batch_ && ids.size(1) == seq_len_,
               "pipeline: micro-batch ", shape_str(ids.shape()), " is not (", batch_, ", ",
               seq_len_, ")");
    // Note [Dropout by coordinates]: the micro-batch's key, whatever order the stages run in.
    DropoutKey key = dropout ? *dropout : DropoutKey{};
    key.micro = mb;
    Tensor x = g == 0 ? model_.embed(ids, pos) : input;
    x = model_.run_blocks(x, pos, boundaries_[static_cast<size_t>(g)],
                          boundaries_[static_cast<size_t>(g) + 1], dropout ? &key : nullptr);
    if (g != last) return x;
    Tensor loss = model_.head_loss(x, targets[static_cast<size_t>(mb)]);
    // As gradient accumulation does (grad_scale is applied by the executor before backward).
    const double factor = options_.loss_scale / static_cast<double>(m);
    if (factor != 1.0) loss = ops::scale(loss, factor);
    return loss;
  };
  cb.before_backward = before_backward;
  cb.loss_scale = grad_scale;
  stats_ = executor_.run(cb);
  if (options_.costs.mode == CostSource::Mode::kMeasured && costs_.empty()) adopt_measured_costs();
  Tensor loss = stats_.loss_sum.defined() ? ops::reshape(stats_.loss_sum, {1})
                                          : Tensor::zeros({1}, DType::kF64, model_.device());
  pp_.broadcast(loss, last_stage_rank());
  return ops::reshape(loss, {});
}

// Note [Schedule costs] in parallel/pp/schedule.h: each rank puts the mean time of its chunks'
// F, B and W per micro-batch at their global stages, zeros elsewhere; the maximum over every
// rank running the lists is then each stage's slowest copy, the same bits on every rank.
void TransformerPipeline::adopt_measured_costs() {
  const int S = shape_.num_global_stages();
  Tensor fbw = Tensor::zeros({3 * static_cast<int64_t>(S)}, DType::kF64);
  double* d = fbw.data<double>();
  for (int c = 0; c < shape_.virtual_stages; ++c) {
    const int g = shape_.global_stage(pp_.rank(), c);
    for (int k = 0; k < 3; ++k) {
      d[3 * g + k] = stats_.op_s.at(static_cast<size_t>(3 * c + k)) / shape_.microbatches;
    }
  }
  (options_.cost_group ? *options_.cost_group : pp_).all_reduce(fbw, ReduceOp::kMax);
  costs_ = costs_from_times(fbw.to_vector());
  executor_.set_costs(costs_);
}

TransformerPipeline::StageUnits TransformerPipeline::parameter_units() const {
  std::set<std::string> mine;
  for (const auto& [name, t] : params_) mine.insert(name);
  const auto model_units = model_.parameter_units();
  StageUnits out;
  out.buckets.resize(model_units.size());
  std::vector<std::pair<std::string, Tensor>> tied;  // the last stage's wte copy, after the head
  for (size_t u = 0; u < model_units.size(); ++u) {
    std::vector<std::pair<std::string, Tensor>> rest;
    for (const auto& [name, t] : model_units[u]) {
      if (!mine.count(name)) continue;
      if (is_tied_copy(name)) {
        tied.emplace_back(name, t);
      } else if (u == 0 && is_tied_table(name) && tied_shared()) {  // alone, as on the last stage
        out.buckets[u].push_back(static_cast<int>(out.units.size()));
        out.units.push_back({{name, t}});
      } else {
        rest.emplace_back(name, t);
      }
    }
    if (!rest.empty()) {
      out.buckets[u].push_back(static_cast<int>(out.units.size()));
      out.units.push_back(std::move(rest));
    }
  }
  if (!tied.empty()) {
    out.buckets[0].push_back(static_cast<int>(out.units.size()));
    out.units.push_back(std::move(tied));
  }
  return out;
}

void TransformerPipeline::sync_tied_gradients(const std::vector<HeldPiece>& gradients) {
  if (!tied_shared()) return;
  const int first = shape_.stage_rank(0), last = last_stage_rank();
  if (pp_.rank() != first && pp_.rank() != last) return;
  std::vector<Tensor> views;
  std::vector<double> ranges;  // begin, end of each piece: both ranks must hold the same
  for (const HeldPiece& g : gradients) {
    if (!is_tied_table(g.param)) continue;
    views.push_back(g.values);
    ranges.push_back(static_cast<double>(g.piece.begin));
    ranges.push_back(static_cast<double>(g.piece.end));
  }
  const int peer = pp_.rank() == first ? last : first;
  if (!tied_ranges_checked_) {  // the layout never changes: checked on the first step only
    const Tensor mine =
        Tensor::from_vector(ranges.empty() ? std::vector<double>{-1.0} : ranges,
                            {static_cast<int64_t>(std::max<size_t>(1, ranges.size()))});
    const Tensor count = Tensor::full({1}, static_cast<double>(mine.numel()), DType::kF64);
    const Tensor peer_count = Tensor::empty_like(count);
    exchange(pp_, count, peer_count, peer);
    LOOM_CHECK(peer_count.item() == count.item(),
               "pipeline: the tied embedding's owned pieces differ between "
               "the first and the last stage (",
               count.item(), " vs ", peer_count.item(), " values)");
    const Tensor theirs = Tensor::empty_like(mine);
    exchange(pp_, mine, theirs, peer);
    LOOM_CHECK(theirs.to_vector() == mine.to_vector(),
               "pipeline: the first and the last stage own "
               "different ranges of the tied wte.weight (Note [Sharded stages])");
    tied_ranges_checked_ = true;
  }
  if (views.empty()) return;
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> flat;
  for (const Tensor& v : views) flat.push_back(ops::reshape(v, {v.numel()}));
  Tensor mine = ops::cat(flat, 0);
  Tensor theirs = Tensor::empty_like(mine);
  exchange(pp_, mine, theirs, peer);
  // first + last on both ranks: the same bits (Note [Tied embeddings across stages]).
  const Tensor sum = pp_.rank() == first ? ops::add(mine, theirs) : ops::add(theirs, mine);
  int64_t at = 0;
  for (Tensor v : views) {
    ops::copy_(v, ops::reshape(sum.narrow(0, at, v.numel()), v.shape()));
    at += v.numel();
  }
}

const std::vector<int>& StageUnitHooks::of(int unit) const {
  LOOM_CHECK(unit >= 0 && static_cast<size_t>(unit) < buckets_.size() &&
                 !buckets_[static_cast<size_t>(unit)].empty(),
             "pipeline: model unit ", unit, " is not run by this stage");
  return buckets_[static_cast<size_t>(unit)];
}

void StageUnitHooks::before_forward(int unit) {
  for (int b : of(unit)) inner_.before_forward(b);
}

Tensor StageUnitHooks::after_forward(int unit, const Tensor& out) {
  const std::vector<int>& b = of(unit);
  Tensor y = out;
  for (auto it = b.rbegin(); it != b.rend(); ++it)
    y = inner_.after_forward(*it, y);  // innermost first
  return y;
}

// Note [Pipeline evaluation]: validation needs no schedule. Each rank walks the global stages
// 0..S−1 of each micro-batch in order and runs those it holds (the shape's stage_rank, Note
// [Pipeline stages and chunks]): stage 0 embeds, every other stage receives its input
// activation from the rank of stage g−1 unless it is this rank (then it continues from its own
// output), and every stage but the last sends its output on to the rank of stage g+1 unless it
// is this one; the last stage adds the micro-batch's loss. With vpp > 1 a rank's chunks thus
// alternate with the other ranks'. Blocking sends and receives cannot deadlock: every rank sends
// and receives in the same global stage order, and a stage only waits for the stage before it. One
// tag suffices, since messages between two ranks arrive in the order they were sent. The
// activations have the training step's shape (B, rows, C), rows = PipelineOptions::activation_rows
// or T.
Tensor TransformerPipeline::forward_only(const Tensor& ids, const Tensor& pos, int64_t rows,
                                         const std::function<Tensor(const Tensor&)>& at_last) {
  autograd::NoGradGuard no_grad;
  const int me = pp_.rank(), last = shape_.num_global_stages() - 1;
  const std::vector<int64_t> act{ids.size(0), rows, model_.config().n_embd};
  Tensor x, out;  // x: the activation entering the next local stage
  for (int g = 0; g <= last; ++g) {
    if (shape_.stage_rank(g) != me) continue;
    if (g == 0) {
      x = model_.embed(ids, pos);
    } else if (shape_.stage_rank(g - 1) != me) {
      x = Tensor::empty(act, model_.compute_dtype().value_or(model_.dtype()), model_.device());
      pp_.recv(x, shape_.stage_rank(g - 1), kEvalTag);
    }
    x = model_.run_blocks(x, pos, boundaries_[static_cast<size_t>(g)],
                          boundaries_[static_cast<size_t>(g) + 1], nullptr);
    if (g == last) {
      out = at_last(x);
    } else if (shape_.stage_rank(g + 1) != me) {
      pp_.send(x.contiguous(), shape_.stage_rank(g + 1), kEvalTag);
    }
  }
  return out;
}

double TransformerPipeline::evaluate(const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& targets) {
  LOOM_CHECK(!inputs.empty() && inputs.size() == targets.size(), "pipeline: evaluate got ",
             inputs.size(), " input and ", targets.size(), " target micro-batches");
  const Tensor pos = options_.positions.defined() ? options_.positions : model_.positions(seq_len_);
  const int64_t rows = options_.activation_rows > 0 ? options_.activation_rows : seq_len_;
  double loss_sum = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& ids = inputs[i];
    LOOM_CHECK(ids.dim() == 2 && ids.size(0) == batch_ && ids.size(1) == seq_len_,
               "pipeline: validation batch ", shape_str(ids.shape()), " is not (", batch_, ", ",
               seq_len_, ")");
    const Tensor l = forward_only(ids, pos, rows,
                                  [&](const Tensor& x) { return model_.head_loss(x, targets[i]); });
    if (l.defined()) loss_sum += l.item();
  }
  Tensor loss = Tensor::full({1}, loss_sum / static_cast<double>(inputs.size()), DType::kF64);
  pp_.broadcast(loss, last_stage_rank());
  return loss.item();
}

std::string TransformerPipeline::describe() const {
  std::ostringstream os;
  os << "pipeline: " << schedule_name(options_.schedule) << ", pp " << shape_.stages << " × vpp "
     << shape_.virtual_stages << ", " << shape_.microbatches << " micro-batches; rank "
     << pp_.rank() << " runs blocks";
  for (int c = 0; c < shape_.virtual_stages; ++c) {
    const size_t g = static_cast<size_t>(shape_.global_stage(pp_.rank(), c));
    os << " [" << boundaries_[g] << ", " << boundaries_[g + 1] << ")";
  }
  os << ", " << params_.size() << " parameter tensors";
  if (options_.costs.mode == CostSource::Mode::kMeasured)
    os << "; lists built at the first step's measured op costs";
  if (options_.costs.mode == CostSource::Mode::kGiven)
    os << "; lists built at op costs F,B,W " << options_.costs.given[0] << ","
       << options_.costs.given[1] << "," << options_.costs.given[2];
  return os.str();
}

}  // namespace loom::parallel::pp
