// data/step_source.cpp — the window and document step sources (data/step_source.h): a step's
// batches or its packed micro-batches as one StepData, and what the cut did to the documents.
#include "data/step_source.h"

#include <iomanip>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace loom {

WindowSource::WindowSource(std::unique_ptr<DataLoader> loader, int64_t micro_batches)
    : loader_(std::move(loader)), micro_batches_(micro_batches) {
  LOOM_CHECK(loader_ != nullptr && micro_batches_ > 0,
             "WindowSource: needs a loader and at least one micro-batch per step, got ",
             micro_batches_);
}

void StepSource::set_micro_batches(int64_t m) {
  LOOM_FAIL("this step source packs its own micro-batches; set_micro_batches(", m,
            ") is for windows");
}

void WindowSource::set_micro_batches(int64_t m) {
  LOOM_CHECK(m >= 1, "WindowSource: micro-batches must be positive, got ", m);
  micro_batches_ = m;
}

StepData WindowSource::next_step() {
  StepData step;
  step.loss = StepLoss::kMean;
  const int64_t B = loader_->batch_size(), T = loader_->seq_len();
  for (int64_t m = 0; m < micro_batches_; ++m) {
    Batch b = loader_->next();
    MicroBatch mb;
    mb.inputs = std::move(b.inputs);
    mb.targets = std::move(b.targets);
    mb.documents = B;
    mb.loss_tokens = B * T;  // every target counts
    step.micro.push_back(std::move(mb));
  }
  // Every rank reads as many windows (Note [Loader windows]).
  step.global_tokens = micro_batches_ * B * T * loader_->world_size();
  step.global_loss_tokens = step.global_tokens;
  return step;
}

PackedSource::PackedSource(std::unique_ptr<PackedLoader> loader) : loader_(std::move(loader)) {
  LOOM_CHECK(loader_ != nullptr, "PackedSource: needs a loader");
}

StepData PackedSource::next_step() {
  PackedStep packed = loader_->next();
  StepData step;
  step.micro = std::move(packed.micro);
  step.loss = StepLoss::kTokens;
  step.global_loss_tokens = packed.global_loss_tokens;
  step.global_tokens = packed.global_tokens;
  step.rank_tokens = std::move(packed.rank_tokens);
  step.rank_micro_batches = std::move(packed.rank_micro_batches);
  return step;
}

// One line on what the cut at data.seq_len does to the documents (Note [Loss tokens and the
// cut] in data/packed_loader.h).
std::string PackedSource::summary() const {
  const PackedDataStats& st = loader_->stats();
  const PackingOptions& o = loader_->options();
  const int64_t all = st.loss_tokens + st.cut_loss_tokens;
  std::ostringstream out;
  out << o.key << ": " << st.documents << " documents, " << st.loss_tokens << " loss tokens";
  if (st.cut_documents == 0) {
    out << "; none longer than data.seq_len " << o.max_len;
    return out.str();
  }
  out << "; " << st.cut_documents << " longer than data.seq_len " << o.max_len
      << " are cut, losing " << st.cut_loss_tokens << " of " << all << " loss tokens ("
      << std::fixed << std::setprecision(1)
      << 100.0 * static_cast<double>(st.cut_loss_tokens) / static_cast<double>(all) << " %)";
  if (st.no_loss_documents > 0)
    out << "; " << st.no_loss_documents << " documents keep no loss token";
  return out.str();
}

}  // namespace loom
