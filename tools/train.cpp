// tools/train.cpp — `train --config FILE [--set section.key=value]... [--resume latest|DIR]`.
// Thin: parses arguments, installs the SIGINT/SIGTERM handler, runs the Trainer. Config errors
// print one line naming the key and exit with code 2; other errors exit with code 1.
#include <csignal>
#include <cstring>
#include <iostream>

#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

std::atomic<bool>* g_stop = nullptr;  // main's flag, for the signal handler only

extern "C" void on_signal(int) {
  if (g_stop) g_stop->store(true);
}

int usage() {
  std::cerr << "usage: train --config FILE [--set section.key=value]... [--resume latest|DIR]"
               " [--stop-at STEP]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  loom::TrainerOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--config" || a == "--set" || a == "--resume" || a == "--stop-at") && i + 1 >= argc) return usage();
    if (a == "--config") config_path = argv[++i];
    else if (a == "--set") overrides.push_back(argv[++i]);
    else if (a == "--resume") options.resume = argv[++i];
    else if (a == "--stop-at") options.stop_at_step = std::stoll(argv[++i]);
    else if (a == "-h" || a == "--help") return usage(), 0;
    else return usage();
  }
  if (config_path.empty()) return usage();

  std::atomic<bool> stop{false};
  g_stop = &stop;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  options.stop = &stop;
  try {
    loom::Config config = loom::load_config(config_path, overrides);
    loom::Trainer trainer(std::move(config), options);
    trainer.run();
  } catch (const loom::ConfigError& e) {
    std::cerr << "config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
