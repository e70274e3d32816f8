// train/train_state.cpp — the trainer's state on disk (Note [Exact resume] in train/trainer.h):
// the checkpoint it writes (parameters written once each, by the copy their placement counts;
// optimizer state by its owner), resuming from one, and train.init_from's initial weights.
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>

#include "core/ops/view.h"
#include "kernels/copy.h"
#include "train/checkpoint.h"
#include "train/llmc_format.h"
#include "train/trainer_state.h"

namespace loom {
namespace fs = std::filesystem;

std::string Trainer::State::state_name(const std::string& name) const {
  // "<state kind>.<parameter>" or, at ZeRO-1, "<state kind>.<parameter>[begin:end]".
  const size_t dot = name.find('.');
  if (!plan.pipe || dot == std::string::npos) return name;
  const std::string param = name.substr(dot + 1);
  return is_tied_copy(param.substr(0, param.find('['))) ? "pp_tied." + name : name;
}

// ZeRO-3 shard names ("<param>[b:e]") differ across TP ranks too: all carry the suffix; a
// tensor-parallel part (its placement splits it over tp) does everywhere.
std::string Trainer::State::param_key(const std::string& name, const Tensor& p) const {
  const bool tp_part = p.placement().split_over(parallel::kAxisTp) != nullptr;
  return tp_part || (plan.zero3() && tp_size() > 1) ? name + tp_suffix() : name;
}

std::vector<std::pair<std::string, Tensor>> Trainer::State::optimizer_state() {
  // ZeRO-0 state is replicated: rank 0 writes it; sharded state is written by its owner.
  if (plan.dp && plan.dp->zero_stage() == 0 && !is_stage_writer()) return {};
  return plan.optimizer_state();
}

void Trainer::State::load_initial_weights(Transformer& model, const std::string& from) {
  if (fs::is_directory(from)) {
    CheckpointContents c = load_checkpoint(from);
    int64_t loaded = 0;
    for (auto& [name, t] : c.tensors) {
      if (name.rfind("model.", 0) != 0) continue;
      const size_t bracket = name.find('[');
      if (bracket != std::string::npos) {  // a ZeRO-3 shard "model.<param>[<begin>:<end>]"
        Tensor p = model.parameter(name.substr(6, bracket - 6));
        const int64_t begin = std::stoll(name.substr(bracket + 1));
        const int64_t end = std::stoll(name.substr(name.find(':', bracket) + 1));
        LOOM_CHECK(begin >= 0 && end <= p.numel() && t.numel() == end - begin, from, ": ", name,
                   " does not fit the model's ", shape_str(p.shape()));
        Tensor dst = p.detach().view({p.numel()}).narrow(0, begin, end - begin);
        ops::copy_(dst, t);
        ++loaded;
        continue;
      }
      Tensor p = model.parameter(name.substr(6));
      LOOM_CHECK(p.shape() == t.shape(), from, ": ", name, " has shape ", shape_str(t.shape()),
                 " but the model expects ", shape_str(p.shape()));
      ops::copy_(p, t.to(p.device()));
      ++loaded;
    }
    *log << "init_from: " << loaded << " tensors from checkpoint " << from << "\n";
  } else {
    load_llmc_model(from, model);
    *log << "init_from: llm.c model file " << from << "\n";
  }
}

void Trainer::State::resume(const std::string& which) {
  const std::string root = (fs::path(cfg.train.out_dir) / "checkpoints").string();
  const std::string dir = which == "latest" ? latest_checkpoint(root) : which;
  LOOM_CHECK(!dir.empty(), "--resume latest: no checkpoint under ", root);
  CheckpointContents c = load_checkpoint(dir);
  std::map<std::string, Tensor> by_name(c.tensors.begin(), c.tensors.end());
  auto restore = [&](const std::string& name, Tensor& into) {
    auto it = by_name.find(name);
    LOOM_CHECK(it != by_name.end(), dir, ": checkpoint has no tensor '", name, "'");
    LOOM_CHECK(it->second.shape() == into.shape(), dir, ": '", name, "' has shape ",
               shape_str(it->second.shape()), " but the run expects ", shape_str(into.shape()));
    ops::copy_(into, it->second.to(into.device()));
  };
  // ZeRO-3: each rank restores the parameter pieces it owns (saved by the same layout).
  for (auto& [name, p] : plan.zero3() ? plan.dp->parameter_shards() : plan.trained())
    restore("model." + param_key(name, p), p);
  for (auto& [name, t] : plan.optimizer_state()) {
    restore("optim." + state_name(name) + tp_suffix(), t);
  }
  auto num = [&](const std::string& key) {
    auto it = c.state.find(key);
    LOOM_CHECK(it != c.state.end(), dir, ": checkpoint state has no '", key, "'");
    return std::stoull(it->second);
  };
  plan.set_optimizer_steps(static_cast<int64_t>(num("optim.step_count")));
  train_loader->set_state(
      {static_cast<int64_t>(num("loader.epoch")), static_cast<int64_t>(num("loader.position"))});
  sample_gen.set_state({num("rng.sample.seed"), num("rng.sample.offset")});
  if (scaler) {
    auto real = [&](const std::string& key) {
      auto it = c.state.find(key);
      LOOM_CHECK(it != c.state.end(), dir, ": checkpoint state has no '", key,
                 "' (saved by a run without f16)");
      return std::stod(it->second);
    };
    scaler->set_state({real("loss_scale.scale"), static_cast<int64_t>(num("loss_scale.good_steps")),
                       static_cast<int64_t>(num("loss_scale.skipped_steps"))});
  }
  step = c.step;
  *log << "resumed from " << dir << " at step " << step << "\n";
}

void Trainer::State::save() {
  CheckpointContents c;
  c.step = step;
  c.config_yaml = config_to_yaml(cfg);
  if (plan.zero3()) {  // each rank holds only its shard: "model.<param>[<begin>:<end>]"
    for (auto& [name, p] : plan.dp->parameter_shards()) {
      // The last stage's tied copy has the first stage's names and values (Note [Sharded stages]).
      if (is_tied_copy(name.substr(0, name.find('[')))) continue;
      c.tensors.emplace_back("model." + param_key(name, p), p);
    }
  } else {  // one copy of each (Note [Placement]): replicas, TP-replicated and tied copies skip
    for (auto& [name, p] : plan.trained()) {
      if (parallel::counted_here(p.placement(), ctx))
        c.tensors.emplace_back("model." + param_key(name, p), p);
    }
  }
  for (auto& [name, t] : optimizer_state())
    c.tensors.emplace_back("optim." + state_name(name) + tp_suffix(), t);
  const LoaderState ls = train_loader->state();
  c.state = {{"optim.step_count", std::to_string(plan.optimizer_steps())},
             {"loader.epoch", std::to_string(ls.epoch)},
             {"loader.position", std::to_string(ls.position)},
             {"rng.sample.seed", std::to_string(sample_gen.state().seed)},
             {"rng.sample.offset", std::to_string(sample_gen.state().offset)}};
  if (scaler) {
    const optim::LossScalerState ls_state = scaler->state();
    std::ostringstream scale;
    scale << std::setprecision(17) << ls_state.scale;  // exact (a power of two)
    c.state["loss_scale.scale"] = scale.str();
    c.state["loss_scale.good_steps"] = std::to_string(ls_state.good_steps);
    c.state["loss_scale.skipped_steps"] = std::to_string(ls_state.skipped_steps);
  }
  const auto t0 = Clock::now();
  const std::string dir = save_checkpoint((fs::path(cfg.train.out_dir) / "checkpoints").string(), c,
                                          cfg.checkpoint.keep, ctx ? &ctx->world() : nullptr);
  *log << "checkpoint: " << dir << " (" << fmt(seconds_since(t0), 2) << " s)\n";
}

}  // namespace loom
