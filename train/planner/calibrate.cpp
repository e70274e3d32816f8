// train/planner/calibrate.cpp — the measurements of Note [Compute calibration] and their cache
// file.
#include "train/planner/calibrate.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/autograd.h"
#include "core/device.h"
#include "core/error.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/copy.h"
#include "kernels/matmul.h"
#include "layers/dropout_key.h"
#include "layers/linear.h"
#include "layers/transformer.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "parallel/comm/communicator.h"
#include "parallel/cp/ring_attention.h"
#include "parallel/dp/sparse_rows.h"
#include "train/trainer.h"

namespace loom::planner {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// N(0, 1) values of dtype dt on dev (drawn in f32: 16-bit types are converted).
Tensor normal(const Shape& shape, Generator& gen, DType dt, Device dev) {
  return randn(shape, gen, DType::kF32, 0.0, 1.0, dev).to(dt);
}

// Waits for the work that produces t (a GPU runs asynchronously): reads one element of it.
void wait_for(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return;
  Tensor x = t;
  for (int64_t d = 0; d < x.dim(); ++d) x = x.narrow(d, 0, 1);
  (void)x.to(Device::cpu());
}

// The median of `reps` timed runs of fwd() then bwd() after one warm-up; each repetition is
// repeated until it lasts 20 ms (small shapes), its time divided by the count. Each pass
// returns a tensor it wrote last, waited for before its time is taken. `timed`, when given, is
// called once before the timed repetitions begin (after the warm-up).
PassTimes time_passes(const std::function<Tensor()>& fwd, const std::function<Tensor(Tensor)>& bwd,
                      const std::function<void()>& reset, int reps = 5,
                      const std::function<void()>& timed = {}) {
  auto both = [&] {
    Tensor y = fwd();
    wait_for(y);
    wait_for(bwd(std::move(y)));
  };
  both();
  reset();
  int inner = 1;
  {
    const auto t0 = Clock::now();
    both();
    reset();
    const double once = since(t0);
    inner = std::clamp(static_cast<int>(0.02 / std::max(once, 1e-7)), 1, 1000);
  }
  if (timed) timed();
  std::vector<double> f, b;
  for (int r = 0; r < reps; ++r) {
    double tf = 0, tb = 0;
    for (int i = 0; i < inner; ++i) {
      auto t0 = Clock::now();
      Tensor y = fwd();
      wait_for(y);
      tf += since(t0);
      t0 = Clock::now();
      wait_for(bwd(std::move(y)));
      tb += since(t0);
      reset();
    }
    f.push_back(tf / inner);
    b.push_back(tb / inner);
  }
  std::nth_element(f.begin(), f.begin() + reps / 2, f.end());
  std::nth_element(b.begin(), b.begin() + reps / 2, b.end());
  return {f[reps / 2], b[reps / 2]};
}

// Rank 0 of a ring of `size` members that are all this process: what it sends to its successor
// it receives from its predecessor (a local copy, done at once); an all-reduce leaves this
// member's values as they are (the sparse-rows reduction's host work is what is timed; its
// transfers are priced from the links). Only those calls are served.
class LoopbackRing final : public parallel::Communicator {
 public:
  explicit LoopbackRing(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  parallel::WorkPtr send_async(Tensor t, int, int) override {
    sent_ = std::move(t);
    return done();
  }
  parallel::WorkPtr recv_async(Tensor t, int, int) override {
    LOOM_CHECK(sent_.defined() && sent_.shape() == t.shape(), "loopback ring: unmatched receive");
    ops::copy_(t, sent_);
    sent_ = Tensor();
    return done();
  }
  parallel::WorkPtr all_reduce_async(Tensor, parallel::ReduceOp) override { return done(); }
  parallel::WorkPtr reduce_scatter_async(Tensor, Tensor, parallel::ReduceOp) override {
    return unused();
  }
  parallel::WorkPtr all_gather_async(Tensor, Tensor) override { return unused(); }
  parallel::WorkPtr all_to_all_async(Tensor, Tensor) override { return unused(); }
  parallel::WorkPtr broadcast_async(Tensor, int) override { return unused(); }
  parallel::WorkPtr barrier_async() override { return unused(); }

 private:
  struct Done final : parallel::Work {
    void wait() override {}
    bool is_done() const override { return true; }
  };
  static parallel::WorkPtr done() { return std::make_shared<Done>(); }
  parallel::WorkPtr unused() const { LOOM_FAIL("loopback ring: only send and receive"); }
  int size_;
  std::string name_ = "loopback";
  Tensor sent_;
};

// The backward pass time_passes times for a layer's output y: y's gradient dy propagated, and
// the input x's gradient, written last, returned to be waited for.
std::function<Tensor(Tensor)> backward_to(const Tensor& x, const Tensor& dy) {
  return [x, dy](Tensor y) {
    autograd::backward({y}, {dy});
    return x.grad();
  };
}

// An attention call on random q (B, heads, T, D) and k, v (B, kv_heads, T, D), forward and
// backward (the gradient of q waited for).
struct AttentionShape {
  int64_t B, heads, kv_heads, T, D;
};
PassTimes time_attention(
    const AttentionShape& a, DType dt, Device dev,
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& f) {
  Generator gen(3);
  Tensor q = normal({a.B, a.heads, a.T, a.D}, gen, dt, dev);
  Tensor k = normal({a.B, a.kv_heads, a.T, a.D}, gen, dt, dev);
  Tensor v = normal({a.B, a.kv_heads, a.T, a.D}, gen, dt, dev);
  for (Tensor* p : {&q, &k, &v}) p->set_requires_grad(true);
  Tensor dy = normal({a.B, a.heads, a.T, a.D}, gen, dt, dev);
  return time_passes([&] { return f(q, k, v); }, backward_to(q, dy),
                     [&] {
                       for (Tensor* p : {&q, &k, &v}) p->zero_grad();
                     });
}

// The device this process calibrates: the CPU, or the first GPU it sees.
Device device_of(const TrainConfig& t) {
  if (t.device == "cpu") return Device::cpu();
  LOOM_CONFIG_CHECK(device_count(DeviceType::kCuda) > 0, "train.device: ", t.device,
                    ": --plan --time measures on the device, and this process sees no GPU");
  return Device::cuda(0);
}

// The model dtype and its compute dtype (mixed precision: f32 master, 16-bit compute).
DType master_dtype(const TrainConfig& t) { return train_dtype(t.dtype); }

std::string shape_key(std::initializer_list<int64_t> dims) {
  std::ostringstream s;
  bool first = true;
  for (int64_t d : dims) {
    s << (first ? "" : "x") << d;
    first = false;
  }
  return s.str();
}

// The model's settings that change its time, for the cache key.
std::string model_key(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T) {
  std::ostringstream s;
  s << m.arch << " C" << m.n_embd << " H" << m.n_head << " KV" << m.n_kv_head << " V"
    << m.padded_vocab() << " tied" << m.tie_embeddings << " recompute " << m.recompute << " drop"
    << m.dropout << " " << t.dtype << "/" << t.precision << " B" << B << " T" << T;
  return s.str();
}

// The trainer's kernel choices (train/trainer_state.h KernelChoices) around a measurement.
struct KernelGuards {
  kernels::AllowTf32Guard tf32;
  kernels::CudnnAttentionGuard attention;
  KernelGuards(bool allow_tf32, bool cudnn) : tf32(allow_tf32), attention(cudnn) {}
};

}  // namespace

Calibration::Calibration(std::string path, const TrainConfig& t, const std::string& gpu)
    : path_(std::move(path)), tf32_(t.allow_tf32) {
  const bool on_that_gpu =
      gpu.empty() || (t.device != "cpu" && device_count(DeviceType::kCuda) > 0 &&
                      kernels::find_kernel<kernels::device_name_k>(DeviceType::kCuda)(0) == gpu);
  std::ostringstream d;
  // A GPU's entries are keyed by its name and the kernel choices that change its times.
  const auto choices = [&] {
    return std::string(tf32_ ? ", tf32" : "") + (cudnn_attention_ ? ", cuDNN attention" : "");
  };
  if (on_that_gpu) {
    dev_ = device_of(t);
    std::string attention;
    cudnn_attention_ = resolve_attention_kernel(t, dev_, &attention);
    if (dev_.is_cpu()) {
      d << "cpu " << kernels::cpu_blas_core() << " ×" << omp_get_max_threads() << " threads";
    } else {
      d << kernels::find_kernel<kernels::device_name_k>(DeviceType::kCuda)(dev_.index) << choices();
    }
  } else {
    // The trainer's choice on that GPU (train/trainer.h resolve_attention_kernel, where the
    // build has cuDNN and it loads): cuDNN's attention for bf16/f16 unless told otherwise.
    replay_ = true;
    const bool half = t.precision == "bf16" || t.precision == "f16";
    cudnn_attention_ = t.attention_kernel == "cudnn" || (t.attention_kernel == "auto" && half);
    d << gpu << choices();
  }
  device_ = d.str();
  if (path_.empty() || !std::filesystem::exists(path_)) return;
  std::ifstream in(path_);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  LOOM_INPUT_CHECK(j.is_object(), path_,
                   ": not a calibration file (a JSON object of devices); remove it to measure "
                   "again");
  if (j.contains(device_) && j[device_].is_object()) {
    for (auto& [k, v] : j[device_].items()) {
      if (v.is_number()) times_[k] = v.get<double>();
    }
  }
  if (j.contains("links") && j["links"].is_object()) {
    for (auto& [k, v] : j["links"].items()) {
      if (v.is_number()) links_[k] = v.get<double>();
    }
  }
}

void Calibration::set_link(const std::string& what, double value) {
  links_[what] = value;
  changed_ = true;
}

std::optional<double> Calibration::link(const std::string& what) const {
  auto it = links_.find(what);
  if (it == links_.end()) return std::nullopt;
  return it->second;
}

void Calibration::save() const {
  if (path_.empty() || !changed_) return;
  nlohmann::json j = nlohmann::json::object();
  if (std::filesystem::exists(path_)) {
    std::ifstream in(path_);
    nlohmann::json old = nlohmann::json::parse(in, nullptr, false);
    if (old.is_object()) j = old;
  }
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [k, v] : times_) mine[k] = v;
  j[device_] = mine;
  nlohmann::json links = nlohmann::json::object();
  for (const auto& [k, v] : links_) links[k] = v;
  j["links"] = links;
  const std::filesystem::path p(path_);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    LOOM_INPUT_CHECK(static_cast<bool>(out), path_, ": cannot write the calibration file");
  }
  std::filesystem::rename(tmp, path_);
}

void Calibration::missing(const std::string& key) const {
  throw ConfigError("--plan --time: the calibration file " + path_ + " has no measurement of '" +
                    key + "' on " + device_ +
                    " (this machine has no such GPU): run the same command once on that GPU, "
                    "which measures what the file lacks, and bring the file here");
}

PassTimes Calibration::cached(const std::string& key, const std::function<PassTimes()>& measure) {
  auto f = times_.find(key + "/fwd"), b = times_.find(key + "/bwd");
  if (f != times_.end() && b != times_.end()) return {f->second, b->second};
  if (replay_) missing(key);
  const KernelGuards guards(tf32_, cudnn_attention_);
  const PassTimes t = measure();
  times_[key + "/fwd"] = t.fwd;
  times_[key + "/bwd"] = t.bwd;
  changed_ = true;
  return t;
}

// Times the config's model at L = 1 and L = 3 and stores the block and the rest (Note [Compute
// calibration]).
namespace {

// The config's model with `layers` blocks at a micro-batch of B × T, ready to be timed.
struct ModelPasses {
  Transformer model;
  Tensor ids, targets, first;
  DropoutKey key{1, 0, 0};
  const DropoutKey* dropout = nullptr;
  ModelPasses(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T, int64_t layers,
              Device dev)
      : model(with_layers(m, layers), master_dtype(t), dev) {
    Generator gen(1);
    model.init_weights(gen);
    if (t.precision != t.dtype) model.set_compute_dtype(train_dtype(t.precision));
    model.train();
    ids = randint({B, T}, 0, m.vocab_size, gen, DType::kI32, dev);
    targets = randint({B, T}, 0, m.vocab_size, gen, DType::kI32, dev);
    if (m.dropout > 0) dropout = &key;
    first = model.named_parameters().front().second;
  }
  static ModelConfig with_layers(ModelConfig m, int64_t layers) {
    m.n_layer = layers;
    return m;
  }
  Tensor fwd() { return model.loss(ids, targets, dropout); }
  Tensor bwd(Tensor loss) {
    autograd::backward(loss);
    return first.grad();
  }
  // `inner` forwards and backwards, each pass timed apart (each waited for); their means.
  PassTimes once(int inner = 1) {
    PassTimes sum;
    for (int i = 0; i < inner; ++i) {
      auto t0 = Clock::now();
      Tensor y = fwd();
      wait_for(y);
      sum.fwd += since(t0);
      t0 = Clock::now();
      wait_for(bwd(std::move(y)));
      sum.bwd += since(t0);
      model.zero_grad();
    }
    return {sum.fwd / inner, sum.bwd / inner};
  }
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

// Note [Compute calibration]'s difference, measured in pairs: the 1- and 3-block models' passes
// alternate, so a drift of the machine's speed between them moves both alike, and the block is
// the median of the pairs' differences (measured apart, one model after the other, the block
// of gpt2-tiny at tp 2's shapes came out 4.9, 8.3 and 10.6 ms in three calibrations).
void Calibration::model_times(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T) {
  const std::string key = model_key(m, t, B, T);
  if (times_.count("block " + key + "/fwd") && times_.count("rest " + key + "/fwd")) return;
  if (replay_) missing("block " + key);
  const KernelGuards guards(tf32_, cudnn_attention_);
  ModelPasses one(m, t, B, T, 1, dev_), three(m, t, B, T, 3, dev_);
  one.once();  // warm-up
  three.once();
  // Small shapes: each repetition repeated until it lasts 20 ms, as time_passes does.
  const int inner =
      std::clamp(static_cast<int>(0.02 / std::max(one.once().total(), 1e-7)), 1, 1000);
  std::vector<double> f1, b1, df, db;
  for (int r = 0; r < 9; ++r) {
    const PassTimes a = one.once(inner), c = three.once(inner);
    f1.push_back(a.fwd);
    b1.push_back(a.bwd);
    df.push_back((c.fwd - a.fwd) / 2);
    db.push_back((c.bwd - a.bwd) / 2);
  }
  const PassTimes block{std::max(0.0, median(df)), std::max(0.0, median(db))};
  times_["block " + key + "/fwd"] = block.fwd;
  times_["block " + key + "/bwd"] = block.bwd;
  times_["rest " + key + "/fwd"] = std::max(0.0, median(f1) - block.fwd);
  times_["rest " + key + "/bwd"] = std::max(0.0, median(b1) - block.bwd);
  changed_ = true;
}

PassTimes Calibration::model_now(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T,
                                 int64_t layers, const std::function<void()>& timed) {
  const KernelGuards guards(tf32_, cudnn_attention_);
  ModelPasses p(m, t, B, T, layers, dev_);
  return time_passes([&] { return p.fwd(); }, [&](Tensor loss) { return p.bwd(std::move(loss)); },
                     [&] { p.model.zero_grad(); }, 5, timed);
}

PassTimes Calibration::block(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T) {
  model_times(m, t, B, T);
  const std::string key = "block " + model_key(m, t, B, T);
  return {times_.at(key + "/fwd"), times_.at(key + "/bwd")};
}

PassTimes Calibration::rest(const ModelConfig& m, const TrainConfig& t, int64_t B, int64_t T) {
  model_times(m, t, B, T);
  const std::string key = "rest " + model_key(m, t, B, T);
  return {times_.at(key + "/fwd"), times_.at(key + "/bwd")};
}

PassTimes Calibration::linear(int64_t rows, int64_t in, int64_t out, bool bias,
                              const std::string& dtype) {
  const std::string key = "linear " + shape_key({rows, in, out}) + (bias ? " bias " : " ") + dtype;
  return cached(key, [&] {
    const DType dt = train_dtype(dtype);
    Linear layer(in, out, bias, dt, dev_);
    Generator gen(2);
    layer.init(gen, 0.02);
    Tensor x = normal({rows, in}, gen, dt, dev_);
    x.set_requires_grad(true);
    Tensor dy = normal({rows, out}, gen, dt, dev_);
    return time_passes([&] { return layer.forward(x); }, backward_to(x, dy),
                       [&] {
                         layer.zero_grad();
                         x.zero_grad();
                       });
  });
}

PassTimes Calibration::attention(int64_t B, int64_t heads, int64_t kv_heads, int64_t T, int64_t D,
                                 const std::string& dtype) {
  const std::string key = "attention " + shape_key({B, heads, kv_heads, T, D}) + " " + dtype;
  return cached(key, [&] {
    return time_attention({B, heads, kv_heads, T, D}, train_dtype(dtype), dev_,
                          [](const Tensor& q, const Tensor& k, const Tensor& v) {
                            return ops::causal_attention(q, k, v);
                          });
  });
}

PassTimes Calibration::ring_attention(int64_t B, int64_t heads, int64_t kv_heads, int64_t T_local,
                                      int64_t D, int64_t cp, const std::string& dtype) {
  const std::string key =
      "ring_attention " + shape_key({B, heads, kv_heads, T_local, D, cp}) + " " + dtype;
  return cached(key, [&] {
    LoopbackRing ring(static_cast<int>(cp));
    return time_attention({B, heads, kv_heads, T_local, D}, train_dtype(dtype), dev_,
                          [&](const Tensor& q, const Tensor& k, const Tensor& v) {
                            return parallel::cp::ring_attention(q, k, v, 0.0, ring);
                          });
  });
}

PassTimes Calibration::mlp(int64_t rows, int64_t C, int64_t F, bool fused,
                           const std::string& dtype) {
  const std::string key =
      std::string(fused ? "mlp fused " : "mlp ") + shape_key({rows, C, F}) + " " + dtype;
  return cached(key, [&] {
    const DType dt = train_dtype(dtype);
    Linear fc(C, F, true, dt, dev_), proj(F, C, true, dt, dev_);
    Generator gen(5);
    fc.init(gen, 0.02);
    proj.init(gen, 0.02);
    Tensor x = normal({rows, C}, gen, dt, dev_);
    x.set_requires_grad(true);
    Tensor dy = normal({rows, C}, gen, dt, dev_);
    return time_passes(
        [&] {
          return fused ? ops::gelu_mlp(x, fc.weight(), fc.bias(), proj.weight(), proj.bias())
                       : proj.forward(ops::gelu(fc.forward(x)));
        },
        backward_to(x, dy),
        [&] {
          fc.zero_grad();
          proj.zero_grad();
          x.zero_grad();
        });
  });
}

PassTimes Calibration::cross_entropy(int64_t rows, int64_t V, const std::string& dtype) {
  const std::string key = "cross_entropy " + shape_key({rows, V}) + " " + dtype;
  return cached(key, [&] {
    const DType dt = train_dtype(dtype);
    Generator gen(6);
    Tensor logits = normal({rows, V}, gen, dt, dev_);
    logits.set_requires_grad(true);
    Tensor targets = randint({rows}, 0, V, gen, DType::kI32, dev_);
    return time_passes([&] { return ops::softmax_cross_entropy(logits, targets); },
                       [&](Tensor loss) {
                         autograd::backward(loss);
                         return logits.grad();
                       },
                       [&] { logits.zero_grad(); });
  });
}

double Calibration::table_rows(int64_t rows, int64_t cols, int64_t used, bool early,
                               const std::string& dtype) {
  const std::string key =
      "table_rows " + shape_key({rows, cols, used}) + (early ? " early " : " ") + dtype;
  return cached(key,
                [&] {
                  const DType dt = train_dtype(dtype);
                  Tensor g = Tensor::zeros({rows, cols}, dt);
                  Generator gen(5);
                  const Tensor values = normal({used, cols}, gen, dt, Device::cpu());
                  const Tensor sum = normal({rows, cols}, gen, dt, Device::cpu());
                  const int64_t stride = std::max<int64_t>(1, rows / std::max<int64_t>(1, used));
                  LoopbackRing group(2);
                  // As DataParallel::finish_buckets does on a host: the rows' reduction, then the
                  // early part.
                  return time_passes(
                      [&] {
                        parallel::dp::all_reduce_rows_avg(g, group);
                        if (early) ops::add_(g, sum);
                        return g;
                      },
                      [](Tensor) { return Tensor(); },
                      [&] {  // the next step's gradient: zero but for the rows its batch used
                        std::memset(g.raw_data(), 0, g.nbytes());
                        const size_t row = static_cast<size_t>(cols) * dtype_size(dt);
                        for (int64_t k = 0; k < used && k * stride < rows; ++k) {
                          std::memcpy(static_cast<char*>(g.raw_data()) + k * stride * row,
                                      static_cast<const char*>(values.raw_data()) + k * row, row);
                        }
                      });
                })
      .fwd;
}

double Calibration::optimizer(const std::string& name, int64_t n, const std::string& dtype) {
  const std::string key = "optimizer " + name + " " + std::to_string(n) + " " + dtype;
  return cached(key, [&] { return PassTimes{optimizer_now(name, n, dtype), 0}; }).fwd;
}

double Calibration::optimizer_now(const std::string& name, int64_t n, const std::string& dtype) {
  const KernelGuards guards(tf32_, cudnn_attention_);
  const DType dt = train_dtype(dtype);
  Generator gen(4);
  Tensor p = normal({n}, gen, dt, dev_);
  p.set_requires_grad(true);
  p.set_grad(normal({n}, gen, dt, dev_));
  std::unique_ptr<optim::Optimizer> opt;
  if (name == "sgd") {
    opt = std::make_unique<optim::SGD>(std::vector<optim::ParamRef>{{"p", p, true}}, 0.9, 0.0);
  } else {
    opt = std::make_unique<optim::AdamW>(std::vector<optim::ParamRef>{{"p", p, true}}, 0.9, 0.95,
                                         1e-8, 0.1);
  }
  // As the trainer steps: the gradients' squared norm, the clip factor from it, the update.
  return time_passes(
             [&] {
               const Tensor sq = optim::grad_sq_sum_tensor({p.grad()});
               opt->step_scaled(1e-4, optim::clip_scale_tensor(sq, 1.0));
               return p;
             },
             [](Tensor) { return Tensor(); }, [] {})
      .fwd;
}

}  // namespace loom::planner
