// tests/parallel/diloco/diloco_engine_test.cpp — DilocoEngine (parallel/diloco/diloco_engine.h)
// with islands as threads of one process (each its own engine, Gloo over the loopback, one
// rendezvous directory): inner AdamW steps on given gradients, and after each sync every
// island's weights against a reference computed here — the same islands' inner AdamW run
// separately, the pseudo-gradients averaged and the outer Nesterov step taken in double — for
// DiLoCo, Streaming DiLoCo (fragments, overlap, mixing) and int8 outer gradients; and an island
// that starts late joins: it receives the running islands' weights and step.
#include "parallel/diloco/diloco_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "optim/adamw.h"
#include "optim/decay_rule.h"
#include "parallel/local_engine.h"

namespace loom::parallel::diloco {
namespace {
namespace fs = std::filesystem;

const std::vector<std::pair<std::string, Shape>> kParams = {{"a", {4, 6}}, {"b", {7}}};
constexpr double kLr = 0.05;

std::string temp_dir() {
  std::string t = (fs::temp_directory_path() / "loom_diloco_XXXXXX").string();
  LOOM_CHECK(::mkdtemp(t.data()) != nullptr, "mkdtemp");
  return t;
}

// Island i's gradient of parameter p, element k, at step s: a fixed pattern per island.
float grad(int island, int64_t s, size_t p, int64_t k) {
  return static_cast<float>(std::sin(0.7 * static_cast<double>(k + 1) + 1.3 * s + 2.1 * island +
                                     0.5 * static_cast<double>(p)) +
                            0.1 * island);
}

// "a" stands for a table (cut by rows over the fragments), "b" for a parameter of block 1
// (Note [Fragments] in parallel/diloco/options.h).
int64_t block_of_param(const std::string& name) { return name == "a" ? -1 : 1; }

// The fragment of element k of parameter p.
int64_t fragment_of_element(size_t p, int64_t k, int64_t fragments) {
  for (const FragmentRange& r :
       fragment_ranges(block_of_param(kParams[p].first), kParams[p].second, fragments)) {
    if (k >= r.begin && k < r.end) return r.fragment;
  }
  return -1;
}

NamedTensors initial_params() {
  NamedTensors out;
  for (size_t p = 0; p < kParams.size(); ++p) {
    Tensor t = Tensor::empty(kParams[p].second);
    for (int64_t k = 0; k < t.numel(); ++k)
      t.data<float>()[k] = static_cast<float>(0.1 * std::cos(0.3 * static_cast<double>(k + p)));
    t.set_requires_grad(true);
    out.emplace_back(kParams[p].first, t);
  }
  return out;
}

std::unique_ptr<LocalEngine> adamw_engine(const NamedTensors& params) {
  auto refs = optim::make_param_refs(params, optim::DecayRule::kAll);
  return std::make_unique<LocalEngine>(
      params, std::make_unique<optim::AdamW>(std::move(refs), 0.9, 0.95, 1e-8, 0.0));
}

void set_grads(const NamedTensors& params, int island, int64_t s) {
  for (size_t p = 0; p < params.size(); ++p) {
    Tensor g = Tensor::empty(params[p].second.shape());
    for (int64_t k = 0; k < g.numel(); ++k) g.data<float>()[k] = grad(island, s, p, k);
    Tensor t = params[p].second;
    t.set_grad(g);
  }
}

std::vector<float> flat(const NamedTensors& params, size_t p) {
  const Tensor& t = params[p].second;
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

DilocoOptions options(const std::string& dir, int64_t islands) {
  DilocoOptions o;
  o.islands = islands;
  o.rendezvous = dir;
  o.address = "127.0.0.1";
  o.inner_steps = 3;
  o.quorum_timeout_s = 20;
  o.join_timeout_s = 60;
  return o;
}

// One island's run: `steps` inner steps; its parameters after each step.
std::vector<std::vector<std::vector<float>>> run_island(DilocoOptions o, int island, int64_t steps,
                                                        int64_t start_after = 0,
                                                        int64_t* started_at = nullptr) {
  o.island = island;
  NamedTensors params = initial_params();
  DilocoParts parts;
  parts.options = o;
  parts.inner = adamw_engine(params);
  parts.fragments_of = [&](const std::string& name, const Shape& shape) {
    return fragment_ranges(block_of_param(name), shape, o.fragments);
  };
  parts.op_timeout_s = 30;
  parts.total_steps = steps;
  DilocoEngine engine(std::move(parts));
  int64_t s = 0;
  if (start_after > 0) std::this_thread::sleep_for(std::chrono::milliseconds(start_after));
  if (auto at = engine.start({0, 0, 0}, [&s] { return RunPosition{s + 1, 0, 0}; })) s = at->step;
  if (started_at) *started_at = s;
  std::vector<std::vector<std::vector<float>>> trace(static_cast<size_t>(steps) + 1);
  while (s < steps) {
    engine.zero_grad();
    set_grads(params, island, s);
    engine.step(kLr, Tensor());
    ++s;
    for (size_t p = 0; p < params.size(); ++p) trace[s].push_back(flat(params, p));
  }
  return trace;
}

// The reference: the islands' inner AdamW run separately, the outer step in double (Note
// [DiLoCo] in parallel/diloco/diloco_engine.h), element by element in its fragment.
// `quantise` (one fragment only): the Δ each island sends.
std::vector<std::vector<std::vector<std::vector<float>>>> reference(
    const DilocoOptions& o, int islands, int64_t steps,
    const std::function<std::vector<float>(int island, int64_t f, const std::vector<float>&)>&
        quantise = nullptr) {
  std::vector<NamedTensors> params(islands);
  std::vector<std::unique_ptr<LocalEngine>> inner;
  for (int i = 0; i < islands; ++i) {
    params[i] = initial_params();
    inner.push_back(adamw_engine(params[i]));
  }
  auto frag = [&](size_t p, size_t k) {
    return fragment_of_element(p, static_cast<int64_t>(k), o.fragments);
  };
  // θ and the momentum per parameter, in double.
  std::vector<std::vector<double>> theta(kParams.size()), buf(kParams.size());
  for (size_t p = 0; p < kParams.size(); ++p) {
    const std::vector<float> v = flat(params[0], p);
    theta[p].assign(v.begin(), v.end());
    buf[p].assign(v.size(), 0.0);
  }
  std::map<int64_t, std::vector<int64_t>> write_backs;  // step → fragments
  std::vector<std::vector<std::vector<std::vector<float>>>> trace(
      islands, std::vector<std::vector<std::vector<float>>>(steps + 1));
  const double mu = o.outer_momentum, lr = o.outer_lr;
  for (int64_t s = 1; s <= steps; ++s) {
    for (int i = 0; i < islands; ++i) {
      inner[i]->zero_grad();
      set_grads(params[i], i, s - 1);
      inner[i]->step(kLr, Tensor());
    }
    auto write_back = [&](int64_t f) {
      for (int i = 0; i < islands; ++i) {
        for (size_t p = 0; p < kParams.size(); ++p) {
          float* w = params[i][p].second.data<float>();
          for (size_t k = 0; k < theta[p].size(); ++k) {
            if (frag(p, k) != f) continue;
            const float outer = static_cast<float>(theta[p][k]);
            w[k] = static_cast<float>(o.fragment_alpha * w[k] + (1 - o.fragment_alpha) * outer);
          }
        }
      }
    };
    for (int64_t f : write_backs[s]) write_back(f);
    for (int64_t f = 0; f < o.fragments; ++f) {
      if (!syncs_at(o, s, f) || s + o.overlap_steps > steps) continue;
      for (size_t p = 0; p < kParams.size(); ++p) {
        std::vector<double> avg(theta[p].size(), 0.0);
        for (int i = 0; i < islands; ++i) {
          std::vector<float> delta(theta[p].size());
          const std::vector<float> phi = flat(params[i], p);
          for (size_t k = 0; k < delta.size(); ++k)
            delta[k] = static_cast<float>(theta[p][k]) - phi[k];
          if (quantise) delta = quantise(i, f, delta);  // one fragment: whole parameters
          for (size_t k = 0; k < delta.size(); ++k) avg[k] += delta[k];
        }
        for (size_t k = 0; k < avg.size(); ++k) {
          if (frag(p, k) != f) continue;
          const double g = avg[k] / islands;
          buf[p][k] = mu * buf[p][k] + g;
          theta[p][k] -= lr * (g + mu * buf[p][k]);
          theta[p][k] = static_cast<float>(theta[p][k]);  // θ is kept in f32
          buf[p][k] = static_cast<float>(buf[p][k]);
        }
      }
      if (o.overlap_steps == 0) {
        write_back(f);
      } else {
        write_backs[s + o.overlap_steps].push_back(f);
      }
    }
    for (int i = 0; i < islands; ++i)
      for (size_t p = 0; p < kParams.size(); ++p) trace[i][s].push_back(flat(params[i], p));
  }
  return trace;
}

void expect_near_traces(const std::vector<std::vector<std::vector<float>>>& got,
                        const std::vector<std::vector<std::vector<float>>>& want, int island) {
  for (size_t s = 1; s < want.size(); ++s) {
    for (size_t p = 0; p < want[s].size(); ++p) {
      for (size_t k = 0; k < want[s][p].size(); ++k) {
        ASSERT_NEAR(got[s][p][k], want[s][p][k], 2e-6 + 2e-6 * std::fabs(want[s][p][k]))
            << "island " << island << " step " << s << " parameter " << kParams[p].first
            << " element " << k;
      }
    }
  }
}

void check_islands(const DilocoOptions& o, int islands, int64_t steps,
                   const std::function<std::vector<float>(int, int64_t, const std::vector<float>&)>&
                       quantise = nullptr) {
  std::vector<std::vector<std::vector<std::vector<float>>>> got(islands);
  std::vector<std::thread> threads;
  for (int i = 0; i < islands; ++i)
    threads.emplace_back([&, i] { got[i] = run_island(o, i, steps); });
  for (std::thread& t : threads) t.join();
  const auto want = reference(o, islands, steps, quantise);
  for (int i = 0; i < islands; ++i) expect_near_traces(got[i], want[i], i);
  // After the last sync's write-back every island holds the same θ: bit for bit.
  EXPECT_EQ(got[0][steps], got[islands - 1][steps]);
}

TEST(DilocoFragments, BlocksStridedTablesCutByRows) {
  EXPECT_EQ(fragment_ranges(5, {3, 4}, 4).size(), 1u);
  EXPECT_EQ(fragment_ranges(5, {3, 4}, 4)[0].fragment, 1);
  EXPECT_EQ(fragment_ranges(5, {3, 4}, 4)[0].end, 12);
  const std::vector<FragmentRange> t = fragment_ranges(-1, {10, 3}, 4);  // rows 2,3,2,3
  ASSERT_EQ(t.size(), 4u);
  int64_t at = 0;
  for (size_t f = 0; f < t.size(); ++f) {
    EXPECT_EQ(t[f].fragment, static_cast<int64_t>(f));
    EXPECT_EQ(t[f].begin, at);
    EXPECT_EQ((t[f].end - t[f].begin) % 3, 0);
    at = t[f].end;
  }
  EXPECT_EQ(at, 30);
  EXPECT_EQ(fragment_ranges(-1, {2}, 4).size(), 2u);  // fewer rows than fragments
  DilocoOptions o;
  o.inner_steps = 8;
  o.fragments = 4;
  EXPECT_TRUE(syncs_at(o, 8, 0) && syncs_at(o, 16, 0) && !syncs_at(o, 4, 0));
  EXPECT_TRUE(syncs_at(o, 2, 1) && syncs_at(o, 10, 1) && syncs_at(o, 6, 3) && !syncs_at(o, 0, 0));
}

TEST(DilocoEngine, OuterNesterovStepMatchesTheReference) {
  const std::string dir = temp_dir();
  check_islands(options(dir, 2), 2, 9);
  fs::remove_all(dir);
}

TEST(DilocoEngine, OneIslandAveragingIsPlainTraining) {
  const std::string dir = temp_dir();
  DilocoOptions o = options(dir, 1);
  o.outer = "average";
  const auto got = run_island(o, 0, 9);
  NamedTensors params = initial_params();
  std::unique_ptr<LocalEngine> plain = adamw_engine(params);
  for (int64_t s = 1; s <= 9; ++s) {
    plain->zero_grad();
    set_grads(params, 0, s - 1);
    plain->step(kLr, Tensor());
    for (size_t p = 0; p < params.size(); ++p) {
      const std::vector<float> want = flat(params, p);
      for (size_t k = 0; k < want.size(); ++k)  // θ − (θ − φ) rounds once: φ to f32 rounding
        ASSERT_NEAR(got[s][p][k], want[k], 1e-7 + 1e-6 * std::fabs(want[k])) << s;
    }
  }
  fs::remove_all(dir);
}

TEST(DilocoEngine, ThreeIslandsPlainAverage) {
  const std::string dir = temp_dir();
  DilocoOptions o = options(dir, 3);
  o.outer = "average";
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  check_islands(o, 3, 6);
  fs::remove_all(dir);
}

TEST(DilocoEngine, StreamingFragmentsOverlapAndMixing) {
  const std::string dir = temp_dir();
  DilocoOptions o = options(dir, 2);
  o.inner_steps = 4;
  o.fragments = 2;
  o.overlap_steps = 1;
  o.fragment_alpha = 0.25;
  // Mixed with α > 0 the islands keep some of their own weights: compare with the reference only.
  std::vector<std::vector<std::vector<std::vector<float>>>> got(2);
  std::thread a([&] { got[0] = run_island(o, 0, 12); });
  std::thread b([&] { got[1] = run_island(o, 1, 12); });
  a.join();
  b.join();
  const auto want = reference(o, 2, 12);
  expect_near_traces(got[0], want[0], 0);
  expect_near_traces(got[1], want[1], 1);
  fs::remove_all(dir);
}

TEST(DilocoEngine, Int8OuterGradientsWithErrorFeedback) {
  const std::string dir = temp_dir();
  DilocoOptions o = options(dir, 2);
  o.quantize = "int8";
  o.quantize_block = 5;
  // Each island's Δ as its lane sends it: one lane holds both parameters of the fragment
  // (a then b in name order), quantised in blocks of 5 within each, error fed back.
  std::map<std::pair<int, int64_t>, std::vector<float>> residual;
  auto quantise = [&](int island, int64_t, const std::vector<float>& d) {
    std::vector<float>& r = residual[{island, static_cast<int64_t>(d.size())}];
    if (r.empty()) r.assign(d.size(), 0.0f);
    std::vector<float> y(d.size());
    for (size_t k = 0; k < d.size(); ++k) y[k] = d[k] + r[k];
    std::vector<uint8_t> q(
        static_cast<size_t>(quantized_bytes(static_cast<int64_t>(d.size()), 5, 8)));
    quantize(y.data(), static_cast<int64_t>(y.size()), 5, 8, q.data());
    std::vector<float> sent(d.size());
    dequantize(q.data(), static_cast<int64_t>(d.size()), 5, 8, sent.data());
    for (size_t k = 0; k < d.size(); ++k) r[k] = y[k] - sent[k];
    return sent;
  };
  check_islands(o, 2, 9, quantise);
  fs::remove_all(dir);
}

TEST(DilocoEngine, LateIslandJoinsWithTheRunningIslandsState) {
  const std::string dir = temp_dir();
  const DilocoOptions o = options(dir, 2);
  std::vector<std::vector<std::vector<float>>> a, b, c;
  int64_t joined_at = -1;
  std::thread ta([&] { a = run_island(o, 0, 12); });
  std::thread tb([&] { b = run_island(o, 1, 12); });
  // Island 2 (not one of the job's first 2) starts once a round has committed.
  std::thread tc([&] {
    while (!fs::exists(fs::path(dir) / "rounds" / "000000000003-f0" / "outcome"))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    DilocoOptions late = o;
    late.islands = 3;
    c = run_island(late, 2, 12, 0, &joined_at);
  });
  ta.join();
  tb.join();
  tc.join();
  // It joined at a sync of the others (step 6 or 9) and from then on matches them after each sync.
  ASSERT_TRUE(joined_at == 6 || joined_at == 9) << joined_at;
  EXPECT_EQ(c[12], a[12]);
  EXPECT_EQ(a[12], b[12]);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::parallel::diloco
