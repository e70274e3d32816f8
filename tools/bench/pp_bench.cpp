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
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (k == "--layers")
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
      LOOM_FAIL("pp_bench: unknown argument ", k, " (--layers --embd --batch --seq --steps)");
  }
  return a;
}

// Mean idle fraction of this rank over `steps` measured steps (after one warm-up).
double measure(const Transformer& model, Communicator& pp, const pp::PipelineOptions& po,
               const Args& a) {
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
  return idle / a.steps;
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
