// train/planner/links.cpp — the link calibration of train/planner/links.h.
#include "train/planner/links.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "layers/transformer.h"
#include "parallel/comm/one_sided.h"
#include "train/config.h"
#include "train/planner/step_time.h"

namespace loom::planner {
namespace {

// One collective's time over a buffer of n f32 elements, every rank's time maxed (the
// collective ends when its slowest member does). A send goes from rank 0 to rank 1 (the others
// only synchronise). Busy link (idle = false): the mean of 7 calls one after another as the
// engines issue buckets (after 2 untimed). Idle link: the median of 7 calls each issued after a
// barrier, so that whatever the previous call left in flight has arrived (Note [Idle and busy
// links] in train/planner/links.h).
double time_collective(parallel::Communicator& c, Collective kind, int64_t n, bool idle) {
  const int g = c.size();
  n = (n + g - 1) / g * g;
  Tensor full = Tensor::zeros({n}, DType::kF32), part = Tensor::zeros({n / g}, DType::kF32);
  // ODC's window: each rank owns n/g elements of the unit (Note [ODC]).
  std::unique_ptr<parallel::OneSidedWindow> window;
  if (kind == Collective::kGet || kind == Collective::kAccumulate)
    window = c.one_sided_window(n / g, DType::kF32, "calibrate-links", 300);
  // One pull (or push) of the pieces the other g − 1 owners hold, in ODC's rotated order.
  auto one_sided = [&](bool get) {
    std::vector<parallel::WorkPtr> works;
    for (int k = 1; k < g; ++k) {
      const int owner = (c.rank() + k) % g;
      Tensor piece = full.narrow(0, owner * (n / g), n / g);
      works.push_back(get ? window->get_async(owner, 0, piece)
                          : window->accumulate_async(owner, 0, piece));
    }
    for (auto& w : works) w->wait();
    if (!get) window->flush();
  };
  auto once = [&] {
    switch (kind) {
      case Collective::kAllReduce:
        c.all_reduce_async(full, parallel::ReduceOp::kSum)->wait();
        break;
      case Collective::kAllGather:
        c.all_gather_async(part, full)->wait();
        break;
      case Collective::kReduceScatter:
        c.reduce_scatter_async(full, part, parallel::ReduceOp::kSum)->wait();
        break;
      case Collective::kSend:
        if (c.rank() == 0) c.send_async(full, 1, 7)->wait();
        if (c.rank() == 1) c.recv_async(full, 0, 7)->wait();
        break;
      case Collective::kGet:
        one_sided(true);
        break;
      case Collective::kAccumulate:
        one_sided(false);
        break;
    }
  };
  // The slowest rank's time of what `body` timed on each.
  auto slowest = [&](double seconds) {
    Tensor m = Tensor::full({1}, seconds, DType::kF64);
    c.all_reduce_async(m, parallel::ReduceOp::kMax)->wait();
    return m.data<double>()[0];
  };
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (int i = 0; i < 2; ++i) once();
  c.barrier_async()->wait();
  if (idle) {
    std::vector<double> calls;
    for (int i = 0; i < 7; ++i) {
      c.barrier_async()->wait();
      const auto t0 = Clock::now();
      once();
      calls.push_back(slowest(since(t0)));
    }
    std::nth_element(calls.begin(), calls.begin() + 3, calls.end());
    return calls[3];
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < 7; ++i) once();
  return slowest(since(t0) / 7);
}

}  // namespace

std::string calibrate_links(const parallel::ParallelContext& ctx, const Config& cfg,
                            Calibration& cal) {
  parallel::Communicator& world = ctx.world();
  const int g = world.size();
  LOOM_CONFIG_CHECK(g >= 2, "--calibrate-links: run it under mpirun with at least 2 ranks");
  // One host or several: every rank's hostname hash, gathered.
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  Tensor mine = Tensor::full({1}, static_cast<double>(std::hash<std::string>{}(name) % (1LL << 52)),
                             DType::kF64);
  Tensor all = Tensor::zeros({g}, DType::kF64);
  world.all_gather_async(mine, all)->wait();
  const double* h = all.data<double>();
  const bool one_host = std::all_of(h, h + g, [&](double x) { return x == h[0]; });
  const std::string cls = one_host ? "intra" : "inter";
  cal.set_link(cls + "/ranks", g);
  // Each collective at two buffer sizes, 4 KiB and 8 MiB: t = α + n/β.
  std::ostringstream o;
  o << cls << " (" << g << " ranks):" << std::fixed << std::setprecision(1);
  const int64_t small = 1024, large = 2 << 20;
  for (Collective kind : kCollectives) {
    const std::string label = collective_name(kind);
    if ((kind == Collective::kGet || kind == Collective::kAccumulate) && uses_nccl(cfg)) {
      // ODC's GPU windows are CUDA IPC ones (parallel/comm/cuda_ipc_window.cpp), not the
      // world communicator's: not measured here.
      o << " " << label << ": not measured on GPUs;";
      continue;
    }
    const double ts = time_collective(world, kind, small, false),
                 tl = time_collective(world, kind, large, false),
                 tl_idle = time_collective(world, kind, large, true);
    const double beta = static_cast<double>(large - small) * 4 / std::max(tl - ts, 1e-9);
    const double alpha = std::max(0.0, ts - small * 4 / beta);
    const double beta_idle = static_cast<double>(large) * 4 / std::max(tl_idle - alpha, 1e-9);
    cal.set_link(cls + "/" + label + "/latency", alpha);
    cal.set_link(cls + "/" + label + "/bandwidth", beta);
    cal.set_link(cls + "/" + label + "/idle_bandwidth", beta_idle);
    o << " " << label << " α " << alpha * 1e6 << " µs β " << beta / 1e6 << " MB/s (idle link "
      << beta_idle / 1e6 << ");";
  }
  // Compute alone (rank 0; the others wait in a barrier) and all at once.
  const int64_t B = cfg.data.batch_size, T = cfg.data.seq_len;
  double alone = 0;
  if (ctx.rank() == 0) alone = cal.model_now(cfg.model, cfg.train, B, T, 1).total();
  world.barrier_async()->wait();
  const double together = cal.model_now(cfg.model, cfg.train, B, T, 1).total();
  Tensor ratio = Tensor::full({1}, ctx.rank() == 0 ? together / alone : 0.0, DType::kF64);
  world.all_reduce_async(ratio, parallel::ReduceOp::kMax)->wait();
  const double slowdown = std::max(1.0, ratio.data<double>()[0]);
  cal.set_link(cls + "/slowdown/" + std::to_string(g), slowdown);
  // The same for the optimizer's update (memory-bound, where sharing a CPU costs most).
  const int64_t n = count_parameters(cfg.model);
  double update_alone = 0;
  if (ctx.rank() == 0) update_alone = cal.optimizer_now(cfg.optim.name, n, cfg.train.dtype);
  world.barrier_async()->wait();
  const double update_together = cal.optimizer_now(cfg.optim.name, n, cfg.train.dtype);
  Tensor r2 =
      Tensor::full({1}, ctx.rank() == 0 ? update_together / update_alone : 0.0, DType::kF64);
  world.all_reduce_async(r2, parallel::ReduceOp::kMax)->wait();
  const double memory_slowdown = std::max(1.0, r2.data<double>()[0]);
  cal.set_link(cls + "/memory_slowdown/" + std::to_string(g), memory_slowdown);
  // The overlap cost (Note [Overlap cost] in train/planner/links.h): the same compute with
  // all-reduces running behind it on every rank's communicator thread, issued after the warm-up
  // and enough to last through the timed passes (5, each ≥ 20 ms; twice that to be sure); the
  // compute's extra time over the time the all-reduces ran beside it (all of the pass).
  const double ar_large = cal.link(cls + "/all_reduce/latency").value_or(0) +
                          large * 4.0 / cal.link(cls + "/all_reduce/bandwidth").value_or(1e30);
  // Every rank must issue the same number (a rank with one all-reduce more than its peers
  // leaves it unmatched: Open MPI's nonblocking collectives then crash or hang), so it comes
  // from the slowest rank's pass, agreed over the ranks, not from each rank's own.
  Tensor longest = Tensor::full({1}, together, DType::kF64);
  world.all_reduce_async(longest, parallel::ReduceOp::kMax)->wait();
  const int calls =
      std::clamp(static_cast<int>(std::ceil(10 * std::max(longest.data<double>()[0], 0.02) /
                                            std::max(ar_large, 1e-9))),
                 1, 1024);
  // One buffer for all of them: the communicator runs one collective at a time, in issue
  // order (the sums are garbage; only the time counts).
  Tensor buffer = Tensor::zeros({large}, DType::kF32);
  std::vector<parallel::WorkPtr> behind;
  world.barrier_async()->wait();
  const double overlapped =
      cal.model_now(cfg.model, cfg.train, B, T, 1,
                    [&] {
                      for (int i = 0; i < calls; ++i)
                        behind.push_back(world.all_reduce_async(buffer, parallel::ReduceOp::kSum));
                    })
          .total();
  for (auto& w : behind) w->wait();
  Tensor r3 = Tensor::full({1}, (overlapped - together) / overlapped, DType::kF64);
  world.all_reduce_async(r3, parallel::ReduceOp::kMax)->wait();
  const double overlap_cost = std::clamp(r3.data<double>()[0], 0.0, 1.0);
  cal.set_link(cls + "/overlap_cost/" + std::to_string(g), overlap_cost);
  if (ctx.rank() == 0) cal.save();
  o << " with " << g << " ranks at once: compute ×" << std::setprecision(3) << slowdown
    << ", optimizer ×" << memory_slowdown << "; a collective behind compute costs it "
    << overlap_cost << " of its time";
  return o.str();
}

}  // namespace loom::planner
