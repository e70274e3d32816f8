// tools/bench/odc_bench.cpp — the imbalance benchmark of variable-length post-training (issue 18):
// the same model and the same documents trained three ways on N data-parallel ranks,
//   zero3      ZeRO-3 with collectives, documents split in order (data.balance none), every rank
//              padded to the largest micro-batch count (its per-unit collectives need it),
//   zero3+bal  ZeRO-3 with collectives and balancing (data.balance flops),
//   odc+bal    ODC (parallel.odc) with balancing: ranks run their own micro-batch counts,
// on a long-tailed length distribution like real SFT data (log-normal, capped), and on equal
// lengths (where ODC must not lose). A measurement, not a test: run under mpirun, e.g.
//   OMP_NUM_THREADS=1 mpirun -np 4 --oversubscribe build/bin/odc_bench [--steps 6] [--layers 4]
//       [--embd 128] [--docs 16] [--cap 512] [--sigma 1.0] [--lengths skewed|equal|both]
//       [--repeats 2]
// Reports per way: the mean step time (steps after the first; the ways alternate, `repeats` runs
// of each, every run listed), each rank's mean time blocked on communication (gathers, pulls and
// the step's final synchronisation: where imbalance is paid, DpStepStats::blocked_s) and the
// speedup over the first way. Rank 0 prints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/documents.h"
#include "parallel/launcher.h"
#include "parallel/parallel_context.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

using namespace loom;
using namespace loom::parallel;
namespace fs = std::filesystem;

struct Args {
  int64_t layers = 4, embd = 128, docs = 16, cap = 512;
  double sigma = 1.0;
  int steps = 6;
  std::string lengths = "both";  // skewed | equal | both
  int repeats = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--layers")
      a.layers = std::atol(v.c_str());
    else if (k == "--embd")
      a.embd = std::atol(v.c_str());
    else if (k == "--docs")
      a.docs = std::atol(v.c_str());
    else if (k == "--cap")
      a.cap = std::atol(v.c_str());
    else if (k == "--sigma")
      a.sigma = std::atof(v.c_str());
    else if (k == "--steps")
      a.steps = std::atoi(v.c_str());
    else if (k == "--lengths")
      a.lengths = v;
    else if (k == "--repeats")
      a.repeats = std::max(1, std::atoi(v.c_str()));
    else
      LOOM_FAIL("odc_bench: unknown argument ", k,
                " (--steps --layers --embd --docs --cap --sigma --lengths --repeats)");
  }
  return a;
}

// Documents of log-normal length (median 64 tokens, sigma as given, capped; sigma 0: all of
// length cap / 2), random tokens, the second half of each in the loss. Written by rank 0.
void write_documents(const std::string& path, const Args& a, double sigma, int64_t count) {
  Generator gen(7);
  const Tensor normal = randn({count}, gen, DType::kF64);
  const Tensor uniform = randint({count * 8}, 1, 255, gen, DType::kI32);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets = {0};
  const double* z = normal.data<double>();
  const int32_t* u = uniform.data<int32_t>();
  int64_t k = 0;
  for (int64_t d = 0; d < count; ++d) {
    const int64_t n =
        sigma > 0 ? std::clamp<int64_t>(std::llround(64.0 * std::exp(sigma * z[d])), 8, a.cap + 1)
                  : a.cap / 2;
    for (int64_t t = 0; t < n; ++t) {
      tokens.push_back(t == 0 ? 0 : u[(k++) % (count * 8)]);
      mask.push_back(t >= n / 2 ? 1 : 0);
    }
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  write_document_shard(path, tokens, mask, offsets);
}

struct Way {
  std::string name;
  bool odc = false;
  std::string balance;
};

struct Result {
  double step_s = 0;
  std::vector<double> blocked_s;  // per rank
};

Result measure(const Way& w, const std::string& data, const Args& a, ParallelContext& ctx) {
  const int n = ctx.world_size();
  std::ostringstream y;
  y << "model: {arch: gpt2, vocab_size: 256, n_layer: " << a.layers
    << ", n_head: 4, n_embd: " << a.embd << ", max_seq_len: " << a.cap << "}\n"
    << "data: {train: " << data << ", batch_size: " << a.docs << ", seq_len: " << a.cap
    << ", packing: true, max_tokens_per_microbatch: " << 2 * a.cap << ", balance: " << w.balance
    << "}\n"
    << "train: {steps: " << a.steps + 1 << ", log_every: 1000, val_every: 0, sample_every: 0, "
    << "out_dir: " << fs::path(data).parent_path().string() << "/out_" << w.name << "}\n"
    << "checkpoint: {every: 0, keep: 0}\nlogging: {jsonl: false, tensorboard: false}\n"
    << "parallel: {dp: " << n << ", zero_stage: 3, odc: " << (w.odc ? "true" : "false") << "}\n";
  std::ostringstream log;
  TrainerOptions o;
  o.log = &log;
  o.parallel = &ctx;
  Trainer t(parse_config_text(y.str()), o);
  const std::vector<StepRecord> records = t.run();
  double step = 0, blocked = 0;
  for (size_t i = 1; i < records.size(); ++i) {  // the first step warms up
    step += records[i].seconds;
    blocked += records[i].comm_blocked_s;
  }
  const auto steps = static_cast<double>(records.size() - 1);
  Tensor mine = Tensor::full({1}, blocked / steps, DType::kF64);
  Tensor all = Tensor::empty({n}, DType::kF64);
  ctx.world().all_gather(mine, all);
  Result r;
  r.step_s = step / steps;
  r.blocked_s = all.to_vector();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  return run_main(argc, argv, [&](MpiRuntime& mpi) {
    if (mpi.size() < 2) {
      std::printf("odc_bench: run under mpirun with 2 or more ranks (dp = world size)\n");
      return 0;
    }
    ParallelOptions po;
    po.shape.dp = mpi.size();
    ParallelContext ctx = ParallelContext::create(po);
    const std::string dir = (fs::temp_directory_path() / "loom_odc_bench").string();
    const int64_t count = a.docs * ctx.world_size() * (a.steps + 2);
    if (ctx.rank() == 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
      write_documents(dir + "/skewed_000000.bin", a, a.sigma, count);
      write_documents(dir + "/equal_000000.bin", a, 0.0, count);
    }
    ctx.world().barrier();
    const std::vector<Way> ways = {
        {"zero3", false, "none"}, {"zero3+bal", false, "flops"}, {"odc+bal", true, "flops"}};
    for (const std::string lengths : {"skewed", "equal"}) {
      if (a.lengths != "both" && a.lengths != lengths) continue;
      const std::string data = dir + "/" + lengths + "_*.bin";
      // The ways alternate (ABC ABC …) so that drift on a shared machine touches each alike.
      std::vector<std::vector<Result>> runs(ways.size());
      for (int rep = 0; rep < a.repeats; ++rep)
        for (size_t w = 0; w < ways.size(); ++w) runs[w].push_back(measure(ways[w], data, a, ctx));
      double base = 0;
      for (size_t w = 0; w < ways.size(); ++w) {
        double step = 0;
        std::vector<double> blocked(static_cast<size_t>(ctx.world_size()), 0.0);
        for (const Result& r : runs[w]) {
          step += r.step_s / a.repeats;
          for (size_t k = 0; k < blocked.size(); ++k) blocked[k] += r.blocked_s[k] / a.repeats;
        }
        if (base == 0) base = step;
        if (ctx.rank() != 0) continue;
        std::printf("%-7s %-10s step %7.1f ms (", lengths.c_str(), ways[w].name.c_str(),
                    step * 1e3);
        for (size_t i = 0; i < runs[w].size(); ++i)
          std::printf("%s%.0f", i ? " " : "", runs[w][i].step_s * 1e3);
        std::printf(")  speedup %.2fx  blocked per rank (ms):", base / step);
        for (double b : blocked) std::printf(" %6.1f", b * 1e3);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    ctx.world().barrier();
    if (ctx.rank() == 0) fs::remove_all(dir);
    return 0;
  });
}
