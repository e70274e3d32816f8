// train/sampling.cpp — what reads the model between steps: validation (the plan's runner over
// the val shards), the next token's logits under any layout (Note [Sampling across ranks]) and
// text sampling with temperature and top-k (train/trainer_state.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <span>

#include "core/autograd.h"
#include "core/ops/view.h"
#include "train/trainer_state.h"

namespace loom {

// Note [Stopping inside long loops]: validation and sampling check the stop flag (SIGINT,
// SIGTERM) between batches and between tokens, so a signal is honoured within one of them, not
// after the whole loop; the step loop then checkpoints and exits at its next step boundary.
// When the forward is collective every rank must stop alike: they agree with one max-reduction
// over the world per check (negligible beside a forward).
bool Trainer::State::stop_requested() {
  bool stop = opt.stop != nullptr && opt.stop->load();
  if (ctx && plan.collective_forward()) {
    Tensor flag = Tensor::full({1}, stop ? 1.0 : 0.0, DType::kF64);
    ctx->world().all_reduce(flag, parallel::ReduceOp::kMax);
    stop = flag.item() > 0;
  }
  return stop;
}

double Trainer::evaluate() {
  State& s = *s_;
  LOOM_CHECK(s.has_val(), "evaluate: no validation data (data.val is empty)");
  autograd::NoGradGuard no_grad;
  KernelChoices kernel_choices(s.cfg.train, s.cudnn_attention);
  s.model().eval();
  s.val_data->set_state({0, 0});
  // The mean over the val batches (one window batch, or one packed step, each); under cp this
  // rank's share of it. A stop request ends the loop early (Note [Stopping inside long loops]):
  // the mean of the batches done. A batch without loss tokens has no loss: it is left out of the
  // mean (Note [Loss tokens and the cut] in data/packed_loader.h); every rank plans it alike.
  double sum = 0;
  int64_t done = 0, counted = 0;
  while (done < s.cfg.train.val_steps && !(done > 0 && s.stop_requested())) {
    const StepData batch = s.val_data->next_step();
    if (batch.global_loss_tokens > 0) {
      sum += s.plan.runner->evaluate(batch);
      ++counted;
    }
    ++done;
  }
  LOOM_INPUT_CHECK(counted > 0, "data.val: none of the ", done,
                   " validation batches holds a loss token within data.seq_len ",
                   s.cfg.data.seq_len, " (cut or masked): there is no validation loss");
  double mean = sum / static_cast<double>(counted);
  if (done < s.cfg.train.val_steps)
    *s.log << "validation stopped after " << done << " of " << s.cfg.train.val_steps
           << " batches (stop requested)\n";
  if (s.cp_size() > 1) {  // the shares sum to each batch's mean (Note [Context-parallel loss])
    Tensor t = Tensor::full({1}, mean, DType::kF64);
    s.ctx->cp().all_reduce(t, parallel::ReduceOp::kSum);
    mean = t.item();
  }
  mean = s.plan.engine->evaluation_loss(mean);  // SDP: the workers' subnetworks' mean
  s.model().train();
  return mean;
}

// Note [Sampling across ranks]: under tp/cp/pp a forward is collective and its logits are
// spread out, so every rank runs the same sampling loop on the same replicated logits row and
// draws the same token from its own copy of the sampling generator (all copies advance alike).
// The context is padded on the right to a multiple of 2·cp (and of tp under sequence
// parallelism) with end-of-text tokens: attention is causal, so positions after the last real
// token change nothing before it. Each cp rank runs its load-balanced chunks (parallel/cp); the
// rank holding the last real position contributes its row, the others zeros (a cp all-reduce);
// the vocabulary parts are all-gathered over tp; under pp the last stage's row is broadcast.
std::vector<double> Trainer::next_token_logits(const std::vector<int32_t>& context) {
  State& s = *s_;
  const ModelConfig& mc = s.cfg.model;
  autograd::NoGradGuard no_grad;
  KernelChoices kernel_choices(s.cfg.train, s.cudnn_attention, KernelChoices::Use::kSampling);
  const bool was_training = s.model().training();
  s.model().eval();
  const int cp = s.cp_size(), tp = s.tp_size();
  const int64_t multiple = (cp > 1 ? 2 * cp : 1) * (s.cfg.parallel.sequence_parallel ? tp : 1);
  const int64_t window = mc.max_seq_len / multiple * multiple;
  LOOM_CHECK(!context.empty() && window > 0,
             "next_token_logits: empty context, or model.max_seq_len ", mc.max_seq_len,
             " is below the layout's sequence multiple ", multiple);
  const int64_t len = std::min<int64_t>(static_cast<int64_t>(context.size()), window);
  const int64_t padded = (len + multiple - 1) / multiple * multiple;
  std::vector<int32_t> ids(context.end() - len, context.end());
  ids.resize(static_cast<size_t>(padded),
             static_cast<int32_t>(std::min<int64_t>(mc.vocab_size - 1, 50256)));
  // This rank's tokens of the window and their positions (Note [Model-parallel step]).
  const SequenceLayout& layout = *s.plan.layers.layout;
  const Tensor input = layout.local_sequence(Tensor::from_vector(ids, {1, padded}), 1);
  Tensor pos = layout.local_positions(padded);
  if (!pos.defined()) pos = s.model().positions(padded).to(Device::cpu());
  // (1, rows, Vp/tp) on the ranks holding the head (every rank without pp).
  const int64_t rows = layout.row_positions(pos).size(0);
  const Tensor logits = s.plan.runner->logits(input.to(s.device), pos.to(s.device), rows);
  // The row travels on the model's device (the communicators may be NCCL's).
  const int64_t vp = mc.padded_vocab();
  Tensor row = Tensor::zeros({vp / tp}, DType::kF64, s.device);
  if (logits.defined()) {
    const std::vector<double> p = pos.to(Device::cpu()).to_vector();
    for (size_t j = 0; j < p.size(); ++j) {
      if (static_cast<int64_t>(p[j]) != len - 1) continue;
      row = ops::contiguous(ops::to_dtype(
          logits.narrow(1, static_cast<int64_t>(j), 1).reshape({vp / tp}), DType::kF64));
    }
    if (tp > 1) {  // the vocabulary parts, in rank order
      Tensor all = Tensor::empty({vp}, DType::kF64, s.device);
      s.ctx->tp().all_gather(row, all);
      row = all;
    }
    if (cp > 1) s.ctx->cp().all_reduce(row, parallel::ReduceOp::kSum);  // one rank holds it
  }
  if (!logits.defined()) row = Tensor::empty({vp}, DType::kF64, s.device);
  s.plan.runner->share_head_row(row);  // under pp the last stage's
  if (was_training) s.model().train();
  std::vector<double> out = row.to(Device::cpu()).to_vector();
  out.resize(static_cast<size_t>(mc.vocab_size));
  return out;
}

std::string Trainer::sample(int64_t n) {
  State& s = *s_;
  if (!s.tokenizer) {
    s.tokenizer = std::make_unique<Tokenizer>(load_tokenizer(s.cfg.data.tokenizer));
    LOOM_CONFIG_CHECK(
        s.cfg.data.tokenizer == "gpt2" || s.tokenizer->vocab_size() <= s.cfg.model.vocab_size,
        "data.tokenizer: ", s.tokenizer->source(), " has ", s.tokenizer->vocab_size(),
        " tokens, more than model.vocab_size ", s.cfg.model.vocab_size);
  }
  // The tokenizer's template starts the text (BOS), else <|endoftext|>; a model with a smaller
  // vocabulary (tests) starts from id 0.
  std::vector<int32_t> ids = s.tokenizer->sequence_prefix();
  const int32_t eot = s.tokenizer->eot_id();
  if (ids.empty()) ids = {eot >= 0 && eot < s.cfg.model.vocab_size ? eot : 0};
  for (int64_t i = 0; i < n && !s.stop_requested(); ++i) {
    const std::vector<double> row = next_token_logits(ids);
    // Temperature, then keep the top-k logits, then sample from the softmax of what is left.
    std::vector<std::pair<double, int32_t>> cand;
    for (size_t v = 0; v < row.size(); ++v)
      cand.emplace_back(row[v] / s.cfg.train.temperature, static_cast<int32_t>(v));
    const size_t k = s.cfg.train.top_k > 0
                         ? std::min<size_t>(cand.size(), static_cast<size_t>(s.cfg.train.top_k))
                         : cand.size();
    std::partial_sort(cand.begin(), cand.begin() + static_cast<int64_t>(k), cand.end(),
                      std::greater<>());
    double z = 0;
    for (size_t j = 0; j < k; ++j) z += std::exp(cand[j].first - cand[0].first);
    double u = rand({1}, s.sample_gen, DType::kF64).item() * z;
    size_t pick = k - 1;
    for (size_t j = 0; j < k; ++j) {
      u -= std::exp(cand[j].first - cand[0].first);
      if (u <= 0) {
        pick = j;
        break;
      }
    }
    ids.push_back(cand[pick].second);
  }
  return s.tokenizer->decode(std::span<const int32_t>(ids.data() + 1, ids.size() - 1));
}

}  // namespace loom
