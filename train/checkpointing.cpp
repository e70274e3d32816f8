// train/checkpointing.cpp — the trainer's state on disk (Note [Exact resume] in train/trainer.h):
// the checkpoint it writes — every parameter and optimizer state as pieces of its global,
// layout-free tensor (Note [Pieces] in core/tensor_piece.h), each written once, by the copy its
// placement counts — and resuming from one written by any layout, whatever the gradient engine.
// (train.init_from's initial weights: load_model_weights in train/convert.h.)
#include <yaml-cpp/yaml.h>

#include <exception>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>

#include "core/ops/view.h"
#include "parallel/gradients.h"
#include "train/checkpoint.h"
#include "train/trainer_state.h"

namespace loom {
namespace fs = std::filesystem;

namespace {

// Note [Checkpoint names]: a parameter is stored as "model.<name>", its optimizer state as
// "optim.<kind>.<name>" (exp_avg, exp_avg_sq, momentum_buffer: the optimizer's state name up to
// its first dot, Note [Optimizer state contract] in optim/optimizer.h), whatever the layout: the
// piece's metadata, not its name, says which part of the global tensor it holds.
std::string param_key(const std::string& param) { return "model." + param; }

// The optimizer's state tensors as pieces: each the piece of its parameter (its placement too),
// keyed "optim.<kind>.<param>".
std::vector<HeldPiece> state_pieces(parallel::GradientEngine& engine,
                                    const std::vector<HeldPiece>& pieces) {
  std::map<std::string, const HeldPiece*> by_name;
  for (const HeldPiece& p : pieces) by_name[p.name] = &p;
  std::vector<HeldPiece> out;
  for (auto& [name, t] : engine.optimizer_state()) {
    const size_t dot = name.find('.');
    auto it = dot == std::string::npos ? by_name.end() : by_name.find(name.substr(dot + 1));
    LOOM_CHECK(it != by_name.end(), "checkpoint: optimizer state '", name,
               "' names no parameter piece the optimizer steps");
    const HeldPiece& p = *it->second;
    out.push_back(
        {"optim." + name.substr(0, dot) + "." + p.param, p.param, t, p.piece, p.placement});
  }
  return out;
}

}  // namespace

// Note [Resume compatibility]: a checkpoint continues under another config only where its
// tensors and its data position still mean the same thing. Refused, naming each key: the model
// (model.*, but for what recompute keeps, model.recompute and recompute_save), the stored
// dtype (train.dtype), the optimizer (optim.name: its state differs), and the data stream
// (data.seq_len, data.seed, data.packing: windows or documents; data.train's pattern only for a
// checkpoint without the data's fingerprint — with one, the shards themselves are compared,
// Note [Data fingerprint] in data/loader.h, so moved data resumes). Everything else may change,
// the parallel layout included (the pieces reshard on load), and each change is logged, one
// line a key (`parallel.sdp.seed 0 → 7`). When the global batch changes, the data continues
// from the same position (the windows consumed so far), so the steps after the resume see
// other batches than the original run would have: said.
void Trainer::State::check_resume_config(const CheckpointReader& r) {
  const std::map<std::string, std::string> saved = flatten_config(r.config_yaml()),
                                           now = flatten_config(config_to_yaml(cfg));
  const bool fingerprint = r.state().count("data.train") > 0;
  auto fixed = [&](const std::string& key) {
    return (key.rfind("model.", 0) == 0 && key != "model.init_from" &&
            key.rfind("model.recompute", 0) != 0) ||
           key == "train.dtype" || key == "optim.name" || (key == "data.train" && !fingerprint) ||
           key == "data.seq_len" || key == "data.seed" || key == "data.packing";
  };
  std::string refused;
  std::vector<std::string> changed;
  for (const auto& [key, value] : now) {
    auto it = saved.find(key);
    if (it == saved.end() || it->second == value) continue;
    const std::string line = key + " " + it->second + " → " + value;
    if (!fixed(key)) {
      changed.push_back(line);
      continue;
    }
    if (!refused.empty()) refused += "; ";
    refused += line;
  }
  if (!refused.empty()) {
    throw ConfigError("--resume " + r.dir() +
                      ": the run's config differs from the checkpoint's where a run cannot "
                      "continue: " +
                      refused);
  }
  for (const std::string& l : changed) *log << "resume: changed " << l << "\n";
  int64_t before = 0;  // the checkpoint's global batch, when its config still parses
  try {
    before = global_batch_sequences(parse_config_text(r.config_yaml()));
  } catch (const ConfigError&) {
    return;  // a config of another Loom version: nothing more to compare
  }
  const int64_t after = global_batch_sequences(cfg);
  if (before != after) {
    *log << "resume: the global batch changes from " << before << " to " << after
         << " sequences per step; the data continues from the same position, so the steps after "
            "the resume see other batches than the original run would have\n";
  }
}

// Note [Resume fallback]: `--resume latest` tries the complete checkpoints newest first. A
// damaged one (a flipped byte, a truncated or missing file, a missing piece, an unknown format
// version: any error reading what this rank needs) is skipped, naming it and why, and the next
// older one is tried; the ranks agree after every attempt (one all-reduce), since a damaged
// file may hold only some ranks' pieces. A config the checkpoint cannot continue under is the
// user's to fix, not damage: it stops the run. An explicit directory is tried alone.
void Trainer::State::resume(const std::string& which) {
  const std::string root = (fs::path(cfg.train.out_dir) / "checkpoints").string();
  std::vector<std::string> incomplete;
  std::vector<std::string> dirs;
  if (which == "latest") {
    dirs = checkpoints_newest_first(root, &incomplete);
    LOOM_INPUT_CHECK(!dirs.empty(), "--resume latest: no checkpoint under ", root,
                     incomplete.empty() ? "" : " (only incomplete ones, listed above)");
  } else {  // a checkpoint, or a run's checkpoints folder: its newest
    dirs = {checkpoint_in(which)};
    LOOM_INPUT_CHECK(!dirs.front().empty(), "--resume ", which,
                     ": a folder without meta.yaml and without complete checkpoints (step_N with "
                     "a meta.yaml) in it; give a checkpoint or a run's checkpoints folder");
  }
  for (const std::string& d : incomplete)
    *log << "resume: skipped " << d << ": no meta.yaml (not a complete checkpoint)\n";
  for (const std::string& dir : dirs) {
    std::string why;
    std::exception_ptr error;
    try {
      resume_from(dir);
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& e) {
      why = e.what();
      error = std::current_exception();
    }
    Tensor failed = Tensor::full({1}, why.empty() ? 0.0 : 1.0, DType::kF64);
    if (ctx) ctx->world().all_reduce(failed, parallel::ReduceOp::kMax);
    if (failed.item() == 0.0) return;
    if (which != "latest") {  // tried alone: its own error (a damaged file's is an InputError)
      if (error) std::rethrow_exception(error);
      LOOM_INPUT_FAIL(dir, ": damaged (another rank could not read its pieces)");
    }
    *log << "resume: skipped " << dir << ": "
         << (why.empty() ? "damaged (another rank could not read its pieces)" : why) << "\n";
  }
  LOOM_INPUT_FAIL("--resume latest: no intact checkpoint under ", root,
                  " (each one's damage is above)");
}

void Trainer::State::resume_from(const std::string& dir) {
  const CheckpointReader r(dir);
  check_resume_config(r);
  // The data the position belongs to (Note [Data fingerprint]); checkpoints before it have none.
  if (const auto saved = r.state().find("data.train"); saved != r.state().end()) {
    const std::string change = data_change(saved->second, train_data->fingerprint());
    if (!change.empty()) {
      throw ConfigError("data.train: the data changed since checkpoint " + dir +
                        " was written: " + change +
                        "; its data position means nothing in other data: restore "
                        "those shards, or start a new run from the checkpoint's weights "
                        "(train.init_from)");
    }
  }
  if (r.step() > cfg.train.steps) {
    throw ConfigError("train.steps: " + std::to_string(cfg.train.steps) + " is below the step " +
                      std::to_string(r.step()) + " of the checkpoint " + dir);
  }
  if (r.step() == cfg.train.steps) {
    *log << "resume: the checkpoint is at train.steps (" << r.step()
         << "): nothing is left to train; raise train.steps to continue\n";
  }
  // Each rank reads its own pieces of every parameter and state (Note [Pieces] in
  // core/tensor_piece.h): the whole local parameters (their tensor-parallel parts, this stage's,
  // SDP's frozen copies), or at ZeRO-3 the owned shards — what the engine holds.
  for (const HeldPiece& p : plan.engine->held_parameters())
    r.read(param_key(p.param), p.piece, p.values);
  for (const HeldPiece& s : state_pieces(*plan.engine, plan.engine->trained_pieces()))
    r.read(s.name, s.piece, s.values);
  const std::map<std::string, std::string>& state = r.state();
  // Note [Engine state] in parallel/engine.h: the scheme's own pieces and counters.
  for (const HeldPiece& s : plan.engine->engine_state()) r.read(s.name, s.piece, s.values);
  plan.engine->restore_state(state);
  auto text = [&](const std::string& key, const std::string& why) {
    auto it = state.find(key);
    LOOM_INPUT_CHECK(it != state.end(), dir, ": checkpoint state has no '", key, "'", why);
    return it->second;
  };
  auto num = [&](const std::string& key) {
    const std::string v = text(key, "");
    try {
      size_t used = 0;
      const uint64_t n = std::stoull(v, &used);
      if (used == v.size() && v[0] != '-') return n;
    } catch (const std::exception&) {
    }
    LOOM_INPUT_FAIL(dir, ": checkpoint state '", key, "' is not a count: '", v, "'");
  };
  const int64_t steps = static_cast<int64_t>(num("optim.step_count"));
  LOOM_INPUT_CHECK(steps <= r.step(), dir, ": optim.step_count ", steps, " exceeds the step ",
                   r.step());
  plan.engine->set_optimizer_steps(steps);
  const LoaderState position{static_cast<int64_t>(num("loader.epoch")),
                             static_cast<int64_t>(num("loader.position"))};
  try {
    train_data->set_state(position);
  } catch (const Error&) {  // outside this data: other shards, or another data.seq_len
    throw ConfigError("data.train: checkpoint " + dir + "'s data position (epoch " +
                      std::to_string(position.epoch) + ", entry " +
                      std::to_string(position.position) +
                      ") lies outside this data (other shards, or another data.seq_len?)");
  }
  sample_gen.set_state({num("rng.sample.seed"), num("rng.sample.offset")});
  if (scaler) {
    const std::string why = " (saved by a run without loss scaling)";
    double scale = 0;
    try {
      scale = std::stod(text("loss_scale.scale", why));
    } catch (const std::exception&) {
      LOOM_INPUT_FAIL(dir, ": checkpoint state 'loss_scale.scale' is not a number");
    }
    text("loss_scale.good_steps", why);
    scaler->set_state({scale, static_cast<int64_t>(num("loss_scale.good_steps")),
                       static_cast<int64_t>(num("loss_scale.skipped_steps"))});
  }
  step = r.step();
  if (metrics) metrics->resumed_at(step);  // the replayed steps' old lines and events go
  *log << "resumed from " << dir << " at step " << step << "\n";
}

void Trainer::State::finish_pending_save() {
  if (!pending_save) return;
  const auto t0 = Clock::now();
  const std::unique_ptr<CheckpointWriter> w = std::move(pending_save);
  const std::string dir = w->finish();
  *log << "checkpoint: " << dir << " (written in the background; waited "
       << fmt(seconds_since(t0), 2) << " s for it)\n";
}

void Trainer::State::save() {
  finish_pending_save();
  CheckpointContents c;
  c.step = step;
  c.config_yaml = config_to_yaml(cfg);
  // One copy of each element (Note [Placement] in core/placement.h): data-parallel replicas,
  // parameters replicated over tp, tied copies and SDP's other holders leave it to the copy
  // that counts (parallel/gradients.h, counted_part).
  const std::vector<HeldPiece> pieces = plan.engine->trained_pieces();
  for (const HeldPiece& p : pieces) {
    if (auto part = parallel::counted_part(p, ctx))
      c.tensors.push_back({param_key(p.param), part->first, part->second});
  }
  for (const HeldPiece& s : state_pieces(*plan.engine, pieces)) {
    if (auto part = parallel::counted_part(s, ctx))
      c.tensors.push_back({s.name, part->first, part->second});
  }
  for (const HeldPiece& s : plan.engine->engine_state()) {  // Note [Engine state]
    if (auto part = parallel::counted_part(s, ctx))
      c.tensors.push_back({s.name, part->first, part->second});
  }
  const LoaderState ls = train_data->state();
  c.state = {{"optim.step_count", std::to_string(plan.engine->optimizer_steps())},
             {"loader.epoch", std::to_string(ls.epoch)},
             {"loader.position", std::to_string(ls.position)},
             {"data.train", train_data->fingerprint()},
             {"rng.sample.seed", std::to_string(sample_gen.state().seed)},
             {"rng.sample.offset", std::to_string(sample_gen.state().offset)}};
  for (const auto& [key, value] : plan.engine->engine_counters()) c.state[key] = value;
  if (scaler) {
    const optim::LossScalerState ls_state = scaler->state();
    std::ostringstream scale;
    scale << std::setprecision(17) << ls_state.scale;  // exact (a power of two)
    c.state["loss_scale.scale"] = scale.str();
    c.state["loss_scale.good_steps"] = std::to_string(ls_state.good_steps);
    c.state["loss_scale.skipped_steps"] = std::to_string(ls_state.skipped_steps);
  }
  const auto t0 = Clock::now();
  auto w = std::make_unique<CheckpointWriter>(
      (fs::path(cfg.train.out_dir) / "checkpoints").string(), std::move(c), cfg.checkpoint.keep,
      ctx ? &ctx->world() : nullptr, cfg.checkpoint.async);
  if (cfg.checkpoint.async) {
    *log << "checkpoint: step " << step << " snapshot in " << fmt(seconds_since(t0), 2)
         << " s, writing in the background\n";
    pending_save = std::move(w);
    return;
  }
  const std::string dir = w->finish();
  *log << "checkpoint: " << dir << " (" << fmt(seconds_since(t0), 2) << " s)\n";
}

}  // namespace loom
