// tools/bench/pp_bench.cpp — measured pipeline bubble per schedule against the simulator's
// (Note [Pipeline cost model] in parallel/pp/simulate.h: (p−1)/(v·m+p−1) for GPipe, 1F1B and
// interleaved; zb-h1's, Note [ZB-H1] in parallel/pp/schedule.h, a third of 1F1B's; zb-v's,
// Note [ZB-V] there, half zb-h1's idle time at m ≥ 2p). A
// measurement, not a test: run under mpirun with pp = the number of ranks, e.g.
//   OMP_NUM_THREADS=1 mpirun -np 2 build/bin/pp_bench [--layers 8] [--embd 128] [--steps 3]
// Each rank runs a TransformerPipeline over a GPT-2 of `layers` blocks on random tokens (no
// optimiser), and reports the executor's own timing: idle = 1 − compute / wall of the step
// (time blocked on receives, on sends at the end, and between ops), averaged over the steps
// after one warm-up step. Rank 0 prints one line per (schedule, v, m) with every rank's idle
// fraction, their mean and the simulator's mean over the ranks.
// --costs measured: zb-h1 and zb-v only, each twice side by side — lists at unit costs and lists
// built at the op costs measured on the first (warm-up) step (parallel.schedule_costs:
// measured, Note [Schedule costs] in parallel/pp/schedule.h) — with the simulator's idle
// fraction of both lists at the measured costs, those costs' F:B:W (mean over the stages) and
// each stage's.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "layers/transformer.h"
#include "parallel/launcher.h"
#include "parallel/pp/pipeline.h"
#include "parallel/pp/simulate.h"

namespace {

using namespace loom;
using namespace loom::parallel;

struct Args {
  int64_t layers = 8, embd = 128, batch = 4, seq = 64;
  int steps = 3;
  bool measured_costs = false;  // --costs measured
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (k == "--costs") {
      const std::string c = argv[i + 1];
      LOOM_CHECK(c == "unit" || c == "measured", "pp_bench: --costs unit or measured, got ", c);
      a.measured_costs = c == "measured";
    } else if (k == "--layers")
      a.layers = v;
    else if (k == "--embd")
      a.embd = v;
    else if (k == "--batch")
      a.batch = v;
    else if (k == "--seq")
      a.seq = v;
    else if (k == "--steps")
      a.steps = static_cast<int>(v);
    else
      LOOM_FAIL("pp_bench: unknown argument ", k,
                " (--layers --embd --batch --seq --steps --costs)");
  }
  return a;
}

// Mean idle fraction of this rank over `steps` measured steps (after one warm-up); the costs the
// lists ran at into *costs when given.
double measure(const Transformer& model, Communicator& pp, const pp::PipelineOptions& po,
               const Args& a, std::vector<pp::OpCosts>* costs = nullptr) {
  pp::TransformerPipeline pipe(model, pp, po, a.batch, a.seq);
  Generator gen(42);
  std::vector<Tensor> ids, tgt;
  for (int i = 0; i < po.microbatches; ++i) {
    ids.push_back(randint({a.batch, a.seq}, 0, model.config().vocab_size, gen, DType::kI32));
    tgt.push_back(randint({a.batch, a.seq}, 0, model.config().vocab_size, gen, DType::kI32));
  }
  double idle = 0;
  for (int s = 0; s <= a.steps; ++s) {
    for (auto [name, p] : pipe.named_parameters()) p.zero_grad();  // handles share the parameter
    pp.barrier();  // every rank starts the step together
    pipe.forward_backward(ids, tgt, nullptr);
    if (s > 0) idle += pipe.last_stats().idle_fraction();
  }
  if (costs) *costs = pipe.schedule_costs();
  return idle / a.steps;
}

// The simulator's idle fraction, mean over the ranks, of the lists built at `built` (empty:
// unit) priced at `priced` (empty: unit).
double model_idle(pp::ScheduleKind kind, const pp::ScheduleShape& shape,
                  const std::vector<pp::OpCosts>& built, const std::vector<pp::OpCosts>& priced) {
  std::vector<std::vector<pp::Instruction>> lists;
  for (int k = 0; k < shape.stages; ++k) lists.push_back(pp::make_schedule(kind, shape, k, built));
  const pp::StageCosts sc = pp::stage_costs(shape, priced);
  const pp::SimulationResult sim = pp::simulate(shape, lists, &sc);
  double mean = 0;
  for (int k = 0; k < shape.stages; ++k) mean += sim.bubble_fraction(k) / shape.stages;
  return mean;
}

// This rank's idle fraction, all-reduced so that every rank holds every rank's; the mean.
double gather_mean(ParallelContext& ctx, double mine) {
  const int p = ctx.pp_size();
  Tensor idle = Tensor::zeros({p}, DType::kF64);
  idle.data<double>()[ctx.pp_rank()] = mine;
  ctx.pp().all_reduce(idle, ReduceOp::kSum);
  double mean = 0;
  for (int i = 0; i < p; ++i) mean += idle.data<double>()[i] / p;
  return mean;
}

// --costs measured: unit-cost lists against measured-cost lists (see the header).
void bench_costs(ParallelContext& ctx, const Transformer& model, const Args& a) {
  const int p = ctx.pp_size();
  if (ctx.rank() == 0) {
    std::printf("%-6s %2s %3s  %10s %10s  %10s %10s  %s\n", "sched", "v", "m", "idle unit",
                "idle meas", "model unit", "model meas", "measured F:B:W per chunk");
  }
  for (int m : {p, 2 * p, 4 * p}) {
    for (pp::ScheduleKind kind :
         {pp::ScheduleKind::kZeroBubbleH1, pp::ScheduleKind::kZeroBubbleV}) {
      const int v = pp::default_virtual_stages(kind);
      if (a.layers % (v * p) != 0) continue;
      pp::PipelineOptions po;
      po.schedule = kind;
      po.vpp = v;
      po.microbatches = m;
      const double unit = gather_mean(ctx, measure(model, ctx.pp(), po, a));
      po.costs = pp::parse_schedule_costs("measured");
      std::vector<pp::OpCosts> costs;
      const double meas = gather_mean(ctx, measure(model, ctx.pp(), po, a, &costs));
      if (ctx.rank() != 0) continue;
      const pp::ScheduleShape shape = pp::schedule_shape(kind, p, v, m);
      double f = 0, b = 0, w = 0;
      for (const pp::OpCosts& c : costs) {
        f += static_cast<double>(c.fwd);
        b += static_cast<double>(c.bwd);
        w += static_cast<double>(c.wgrad);
      }
      std::printf("%-6s %2d %3d  %10.3f %10.3f  %10.3f %10.3f  %.2f:%.2f:1\n",
                  pp::schedule_name(kind), v, m, unit, meas, model_idle(kind, shape, {}, costs),
                  model_idle(kind, shape, costs, costs), f / w, b / w);
      std::string per;  // each global stage's F/B/W in the costs' units (the largest 1000)
      for (const pp::OpCosts& c : costs) {
        char one[64];
        std::snprintf(one, sizeof one, " %lld/%lld/%lld", static_cast<long long>(c.fwd),
                      static_cast<long long>(c.bwd), static_cast<long long>(c.wgrad));
        per += one;
      }
      std::printf("       stage costs F/B/W:%s\n", per.c_str());
    }
  }
}

int bench(ParallelContext& ctx, const Args& a) {
  const int p = ctx.pp_size();
  ModelConfig mc;
  mc.arch = "gpt2";
  mc.vocab_size = 512;
  mc.n_layer = a.layers;
  mc.n_head = 4;
  mc.n_embd = a.embd;
  mc.max_seq_len = a.seq;
  Transformer model(mc);
  Generator init(1);
  model.init_weights(init);
  if (ctx.rank() == 0) {
    std::printf(
        "pp_bench: pp %d, GPT-2 %lld layers, C %lld, B %lld, T %lld, %d steps after 1 warm-up\n", p,
        static_cast<long long>(a.layers), static_cast<long long>(a.embd),
        static_cast<long long>(a.batch), static_cast<long long>(a.seq), a.steps);
  }
  if (a.measured_costs) {
    bench_costs(ctx, model, a);
    return 0;
  }
  if (ctx.rank() == 0) {
    std::printf("%-12s %3s %3s  %-24s %8s %8s\n", "schedule", "v", "m", "idle per rank", "mean",
                "model");
  }
  struct Row {
    pp::ScheduleKind kind;
    int v, m;
  };
  std::vector<Row> rows;
  for (int m : {p, 2 * p, 4 * p}) {
    rows.push_back({pp::ScheduleKind::kGpipe, 1, m});
    rows.push_back({pp::ScheduleKind::k1F1B, 1, m});
    if (a.layers % (2 * p) == 0) rows.push_back({pp::ScheduleKind::kInterleaved, 2, m});
    rows.push_back({pp::ScheduleKind::kZeroBubbleH1, 1, m});
    if (a.layers % (2 * p) == 0) rows.push_back({pp::ScheduleKind::kZeroBubbleV, 2, m});
  }
  for (const Row& r : rows) {
    pp::PipelineOptions po;
    po.schedule = r.kind;
    po.vpp = r.v;
    po.microbatches = r.m;
    Tensor idle = Tensor::zeros({p}, DType::kF64);
    idle.data<double>()[ctx.pp_rank()] = measure(model, ctx.pp(), po, a);
    ctx.pp().all_reduce(idle, ReduceOp::kSum);
    if (ctx.rank() == 0) {
      std::string per;
      double mean = 0;
      for (int i = 0; i < p; ++i) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "%.3f ", idle.data<double>()[i]);
        per += buf;
        mean += idle.data<double>()[i] / p;
      }
      const pp::ScheduleShape shape = pp::schedule_shape(r.kind, p, r.v, r.m);
      std::vector<std::vector<pp::Instruction>> lists;
      for (int k = 0; k < p; ++k) lists.push_back(pp::make_schedule(r.kind, shape, k));
      const pp::SimulationResult sim = pp::simulate(shape, lists);
      double model_mean = 0;
      for (int k = 0; k < p; ++k) model_mean += sim.bubble_fraction(k) / p;
      std::printf("%-12s %3d %3d  %-24s %8.3f %8.3f\n", pp::schedule_name(r.kind), r.v, r.m,
                  per.c_str(), mean, model_mean);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  return run_main(argc, argv, [&](MpiRuntime& mpi) {
    ParallelOptions po;
    po.shape.pp = mpi.size();
    ParallelContext ctx =
        mpi.size() > 1 ? ParallelContext::create(po) : ParallelContext::single_process();
    if (mpi.size() < 2) {
      std::printf("pp_bench: run under mpirun with 2 or more ranks (pp = world size)\n");
      return 0;
    }
    return bench(ctx, a);
  });
}
