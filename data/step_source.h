// data/step_source.h — StepSource: where the trainer reads its steps from, whatever the data's
// form, and its two kinds: WindowSource (fixed-length windows, DataLoader: Note [Loader windows]
// in data/loader.h) and PackedSource (whole documents, PackedLoader: Note [Packed steps] in
// data/packed_loader.h). Each step comes as one StepData (data/step_data.h); the trainer holds
// one source for training and one for validation and never asks which kind it reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/loader.h"
#include "data/packed_loader.h"
#include "data/step_data.h"

namespace loom {

class StepSource {
 public:
  virtual ~StepSource() = default;
  // This rank's next step; rolls into the next epoch when one is exhausted, as its loader does.
  virtual StepData next_step() = 0;
  // Where the source is (saved in checkpoints, identical on every rank) and the resume to it,
  // validated against this data.
  virtual LoaderState state() const = 0;
  virtual void set_state(LoaderState state) = 0;
  virtual std::string fingerprint() const = 0;  // Note [Data fingerprint] in data/loader.h
  // What opening the data found that the log should say, one line without its newline ("" for
  // nothing): for documents the cut at max_len (Note [Loss tokens and the cut]).
  virtual std::string summary() const { return ""; }
  // Windows: the micro-batches of the steps from now on (train.batch_ramp_steps, Note [Batch
  // ramp] in train/config.h); documents pack their own and refuse.
  virtual void set_micro_batches(int64_t m);
};

// Windows: a step is the loader's next `micro_batches` (B, T) batches, one micro-batch each
// (optim.grad_accum for the plain runner, the pipeline's micro-batches under pp; validation
// reads one per step). StepLoss::kMean.
class WindowSource final : public StepSource {
 public:
  WindowSource(std::unique_ptr<DataLoader> loader, int64_t micro_batches);
  StepData next_step() override;
  LoaderState state() const override { return loader_->state(); }
  void set_state(LoaderState state) override { loader_->set_state(state); }
  std::string fingerprint() const override { return loader_->fingerprint(); }
  const DataLoader& loader() const { return *loader_; }
  void set_micro_batches(int64_t m) override;

 private:
  std::unique_ptr<DataLoader> loader_;
  int64_t micro_batches_;
};

// Documents: a step is the loader's next PackedStep, its micro-batches as they were packed.
// StepLoss::kTokens.
class PackedSource final : public StepSource {
 public:
  explicit PackedSource(std::unique_ptr<PackedLoader> loader);
  StepData next_step() override;
  LoaderState state() const override { return loader_->state(); }
  void set_state(LoaderState state) override { loader_->set_state(state); }
  std::string fingerprint() const override { return loader_->fingerprint(); }
  std::string summary() const override;
  const PackedLoader& loader() const { return *loader_; }

 private:
  std::unique_ptr<PackedLoader> loader_;
};

}  // namespace loom
