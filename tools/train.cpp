// tools/train.cpp — `train --config FILE [--set section.key=value]... [--resume latest|DIR]`.
// `--eval` trains nothing: it evaluates the model as built (its initial weights, model.init_from,
// or --resume's checkpoint: e.g. an SDP run's, consolidated into the full model by one
// process) on train.val_steps batches of data.val and prints `val loss X`. `--plan` trains
// nothing either: it prints the predicted memory of every rank of the layout (train/planner/,
// docs/planning.md), from the config alone, in one process; with `--device NAME` also whether
// each rank fits on that GPU (train/planner/devices.h).
// Thin: parses arguments, installs the SIGINT/SIGTERM handler, starts MPI (a plain run is a
// world of one; `mpirun -np N train … --set parallel.dp=N` runs data parallel, and
// parallel.pp=P pipeline parallel on dp·P ranks), runs the
// Trainer. Config errors print one line naming the key and exit with code 2; any other error
// on any rank ends the whole job with the message and the rank (exit code 1).
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>

#include "core/error.h"
#include "parallel/launcher.h"
#include "parallel/parallel_context.h"
#include "train/config.h"
#include "train/noise_scale.h"
#include "train/planner/devices.h"
#include "train/planner/links.h"
#include "train/planner/memory.h"
#include "train/planner/search.h"
#include "train/planner/step_time.h"
#include "train/trainer.h"

namespace {

std::atomic<bool>* g_stop = nullptr;  // main's flag, for the signal handler only

extern "C" void on_signal(int) {
  if (g_stop) g_stop->store(true);
}

// `text`, the whole of it, as a positive integer or number; none otherwise (the caller names
// the flag).
std::optional<int64_t> positive_integer(const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || v <= 0) return std::nullopt;
  return v;
}
std::optional<double> positive_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !(v > 0)) return std::nullopt;
  return v;
}

// The links of --plan --time: a GPU's data sheet with --device a100|h100|h200 (Note [Data-sheet
// links] in train/planner/step_time.h), else what `--calibrate-links` measured into the file.
loom::planner::ClusterLinks plan_links(const loom::planner::Calibration& cal,
                                       const loom::planner::DeviceSpec* device,
                                       int64_t ranks_per_host) {
  if (device != nullptr && device->network_bytes_per_s > 0)
    return loom::planner::links_from_sheet(*device, ranks_per_host);
  return loom::planner::links_from(cal, ranks_per_host);
}

int usage() {
  std::cerr << "usage: train --config FILE [--set section.key=value]... [--resume latest|DIR]"
               " [--stop-at STEP] [--profile] [--print-config] [--eval] [--plan [--device "
               "a100|h100|h200] [--search --gpus N] [--noise-scale TOKENS] [--time "
               "[--ranks-per-host N]]] [--calibrate-links] [--calibration FILE]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  loom::TrainerOptions options;
  bool eval_only = false, plan_only = false;
  std::string plan_device;   // --device NAME: --plan also says whether each rank fits on one
  bool plan_search = false;  // --search --gpus N: every layout of N GPUs that fits (--plan)
  std::string plan_gpus;
  std::string plan_noise;  // --noise-scale TOKENS (a run's train/noise_scale_tokens): --plan
                           // says the critical batch it implies and the dp degree reaching it
  // --time: --plan also predicts the step time (train/planner/step_time.h) from the calibration
  // file (--calibration FILE, default $LOOM_CALIBRATION or ~/.cache/loom/calibration.json),
  // measuring what it lacks; --ranks-per-host N places the world's ranks on hosts (default: one
  // host). --calibrate-links (under mpirun) measures the cluster's links into that file.
  bool plan_time = false, calibrate_links = false;
  std::string ranks_per_host = "0", calibration_path;
  if (const char* env = std::getenv("LOOM_CALIBRATION")) calibration_path = env;
  if (calibration_path.empty() && std::getenv("HOME") != nullptr)
    calibration_path = std::string(std::getenv("HOME")) + "/.cache/loom/calibration.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--config" || a == "--set" || a == "--resume" || a == "--stop-at" ||
         a == "--device" || a == "--gpus" || a == "--noise-scale" || a == "--calibration" ||
         a == "--ranks-per-host") &&
        i + 1 >= argc)
      return usage();
    if (a == "--config")
      config_path = argv[++i];
    else if (a == "--set")
      overrides.push_back(argv[++i]);
    else if (a == "--resume")
      options.resume = argv[++i];
    else if (a == "--stop-at") {
      // A positive step, validated like a config key (exit 2, naming the flag).
      const std::string v = argv[++i];
      const std::optional<int64_t> step = positive_integer(v);
      if (!step) {
        std::cerr << "config error: --stop-at: expected a positive step, got '" << v << "'\n";
        return 2;
      }
      options.stop_at_step = *step;
    } else if (a == "--profile")
      options.profile_path = "profile";  // resolved per rank below
    else if (a == "--print-config")
      options.print_config = true;
    else if (a == "--eval")
      eval_only = true;
    else if (a == "--plan")
      plan_only = true;
    else if (a == "--device" && i + 1 < argc)
      plan_device = argv[++i];
    else if (a == "--search")
      plan_search = true;
    else if (a == "--noise-scale" && i + 1 < argc)
      plan_noise = argv[++i];
    else if (a == "--gpus" && i + 1 < argc)
      plan_gpus = argv[++i];
    else if (a == "--time")
      plan_time = true;
    else if (a == "--calibrate-links")
      calibrate_links = true;
    else if (a == "--calibration")
      calibration_path = argv[++i];
    else if (a == "--ranks-per-host")
      ranks_per_host = argv[++i];
    else if (a == "-h" || a == "--help")
      return usage(), 0;
    else
      return usage();
  }
  if (config_path.empty()) return usage();
  if (plan_only) {  // one process, no MPI: the plan of every rank, equal ones printed once
    try {
      const loom::Config config = loom::load_config(config_path, overrides);
      loom::validate_config(config);
      if (!plan_noise.empty()) {  // Note [Gradient noise scale] in train/noise_scale.h
        const std::optional<double> tokens = positive_number(plan_noise);
        LOOM_CONFIG_CHECK(tokens.has_value(),
                          "--noise-scale: expected a positive number of tokens, got '", plan_noise,
                          "'");
        std::cout << loom::format_critical_batch(config, *tokens);
      }
      // --ranks-per-host: 0 (the default) puts every rank on one host.
      const std::optional<int64_t> per_host_flag =
          ranks_per_host == "0" ? std::optional<int64_t>(0) : positive_integer(ranks_per_host);
      LOOM_CONFIG_CHECK(per_host_flag.has_value(),
                        "--ranks-per-host: expected a positive number, got '", ranks_per_host, "'");
      const int64_t per_host = *per_host_flag;
      std::string last_body;
      const loom::planner::DeviceSpec* device =
          plan_device.empty() ? nullptr : &loom::planner::find_device(plan_device);
      if (plan_search) {
        LOOM_CONFIG_CHECK(device != nullptr,
                          "--search: needs --device NAME (a100, h100, h200, or cpu)");
        const std::optional<int64_t> gpus = positive_integer(plan_gpus);
        LOOM_CONFIG_CHECK(gpus.has_value(), "--gpus: expected a positive number of GPUs, got '",
                          plan_gpus, "'");
        std::vector<loom::planner::LayoutCandidate> found =
            loom::planner::search_layouts(config, *gpus, *device);
        if (plan_time) {  // ranked by the step-time model (train/planner/step_time.h)
          loom::planner::Calibration cal(calibration_path, config.train, device->cuda_name);
          loom::planner::rank_by_step_time(found, cal, plan_links(cal, device, per_host));
          cal.save();
        }
        std::cout << loom::planner::format_search(found, *gpus, *device);
        return 0;
      }
      for (const loom::planner::MemoryPlan& p : loom::planner::plan_memory_all(config)) {
        std::string text = loom::planner::format_memory_plan(p);
        if (device) text += loom::planner::format_fit(p.peak_bytes, *device);
        const std::string body = text.substr(text.find('\n'));
        if (body != last_body) std::cout << text;
        last_body = body;
      }
      if (plan_time) {  // Note [Step-time model] in train/planner/step_time.h
        loom::planner::Calibration cal(calibration_path, config.train,
                                       device ? device->cuda_name : "");
        const loom::planner::ClusterLinks links = plan_links(cal, device, per_host);
        const loom::planner::StepTimePlan t = loom::planner::plan_step_time(config, cal, links);
        cal.save();
        std::cout << "step time (predicted; " << cal.device()
                  << (cal.replay_only() ? " as measured there" : "") << ", calibration "
                  << calibration_path << "; links "
                  << (links.intra.source == "measured"
                          ? "measured (--calibrate-links)"
                          : "from " + device->name + "'s data sheet, unchecked, " +
                                std::to_string(links.ranks_per_host) + " per host")
                  << "):\n"
                  << loom::planner::format_step_time(
                         t, device && device->bf16_flops > 0 ? device : nullptr);
      }
    } catch (const loom::ConfigError& e) {
      std::cerr << "config error: " << e.what() << "\n";
      return 2;
    }
    return 0;
  }

  std::atomic<bool> stop{false};
  g_stop = &stop;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  options.stop = &stop;
  loom::parallel::MpiRuntime mpi(&argc, &argv);
  try {
    loom::Config config = loom::load_config(config_path, overrides);
    std::unique_ptr<loom::parallel::ParallelContext> ctx;
    if (mpi.size() > 1 || config.parallel.dp > 1 || config.parallel.pp > 1 ||
        config.parallel.tp > 1 || config.parallel.cp > 1) {
      loom::parallel::ParallelOptions p;
      p.shape.dp = static_cast<int>(config.parallel.dp);
      p.shape.pp = static_cast<int>(config.parallel.pp);
      p.shape.cp = static_cast<int>(config.parallel.cp);
      p.shape.tp = static_cast<int>(config.parallel.tp);
      p.mics_partition_size = static_cast<int>(config.parallel.mics_partition_size);
      p.cp_ulysses = static_cast<int>(config.parallel.cp_ulysses);
      p.comm_timeout_s = config.parallel.comm_timeout_s;
      p.tp_across_hosts = config.parallel.tp_across_hosts;
      // parallel.backend: NCCL communicators on GPUs, or MPI ones staging CUDA tensors.
      p.device = loom::uses_nccl(config) ? loom::DeviceType::kCuda : loom::DeviceType::kCpu;
      p.nccl_rules = config.parallel.backend == "mpi_nccl_rules";
      ctx = std::make_unique<loom::parallel::ParallelContext>(
          loom::parallel::ParallelContext::create(p));
      options.parallel = ctx.get();
    }
    if (!options.profile_path.empty()) {
      options.profile_path =
          config.train.out_dir + "/trace_rank" + std::to_string(mpi.rank()) + ".json";
    }
    if (calibrate_links) {  // train/planner/links.h
      LOOM_CONFIG_CHECK(ctx != nullptr,
                        "--calibrate-links: run it under mpirun with at least 2 ranks");
      loom::planner::Calibration cal(calibration_path, config.train);
      const std::string line = loom::planner::calibrate_links(*ctx, config, cal);
      if (mpi.rank() == 0) std::cout << "links: " << line << " -> " << calibration_path << "\n";
      return 0;
    }
    const bool has_val = !config.data.val.empty();
    loom::Trainer trainer(std::move(config), options);
    if (eval_only) {
      if (!has_val) throw loom::ConfigError("--eval: data.val is empty (nothing to evaluate on)");
      const double v = trainer.evaluate();
      if (mpi.rank() == 0) std::cout << "val loss " << std::setprecision(8) << v << "\n";
    } else {
      trainer.run();
    }
  } catch (const loom::ConfigError& e) {
    // Every rank reads the same config, so every rank reports and exits alike.
    if (mpi.rank() == 0) std::cerr << "config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    if (mpi.size() > 1) loom::parallel::abort_job(e.what());
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
