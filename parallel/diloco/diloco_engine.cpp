// parallel/diloco/diloco_engine.cpp — DiLoCo's outer loop around the island's engine (Note
// [DiLoCo] in the header): the sync schedule, the round on the lanes, the write-back, the state
// a joining island receives and what checkpoints keep.
#include "parallel/diloco/diloco_engine.h"

#include <chrono>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "core/ops/view.h"
#include "parallel/comm/communicator.h"
#include "parallel/gradients.h"

namespace loom::parallel::diloco {
namespace {

using Clock = std::chrono::steady_clock;

std::string round_key(int64_t step, int64_t f) {
  std::ostringstream os;
  os << std::setw(12) << std::setfill('0') << step << "-f" << f;
  return os.str();
}

int64_t fragment_of_key(const std::string& key) {
  return std::stoll(key.substr(key.find("-f") + 2));
}

OuterOptions outer_options(const DilocoOptions& o) {
  if (o.outer == "average") return {1.0, 0.0, false};
  return {o.outer_lr, o.outer_momentum, o.outer == "nesterov"};
}

// Broadcasts lane 0's (rank 0's) numbers to the island's ranks.
std::vector<int64_t> island_broadcast(Communicator* world, std::vector<int64_t> v) {
  if (world == nullptr || world->size() == 1) return v;
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  world->broadcast(t, 0);
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

std::string island_broadcast_text(Communicator* world, const std::string& text) {
  std::vector<int64_t> v(64, 0);
  for (size_t i = 0; i < text.size() && i < v.size(); ++i)
    v[i] = static_cast<unsigned char>(text[i]);
  v = island_broadcast(world, v);
  std::string out;
  for (int64_t c : v) {
    if (c == 0) break;
    out += static_cast<char>(c);
  }
  return out;
}

void append(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

}  // namespace

// A round from its launch to its write-back. The lanes' part (run_round) may run on a
// background thread; everything else is on the training thread.
struct DilocoEngine::Round {
  int64_t fragment = 0, launched_at = 0, write_back_at = 0;
  std::string key;
  bool joining = false;      // this island takes part to receive the state
  std::vector<float> delta;  // this lane's θ − φ
  Quorum quorum;
  std::unique_ptr<LaneRound> link;
  std::vector<float> trial_residual;  // error feedback's residual if the round commits
  bool commit = false, in_quorum = false, contributes = false, receives = false, source = false;
  std::string failure;   // the link's error, for the log
  std::string mismatch;  // an island that trains another model: a ConfigError
  int64_t bytes = 0;
  double seconds = 0;
  std::thread thread;
};

DilocoEngine::DilocoEngine(DilocoParts p)
    : o_(std::move(p.options)),
      inner_(std::move(p.inner)),
      world_(p.world),
      ctx_(p.ctx),
      op_timeout_s_(p.op_timeout_s),
      total_steps_(p.total_steps),
      log_(p.log) {
  const int size = world_ ? world_->size() : 1;
  const int lanes = o_.lanes > 0 ? static_cast<int>(o_.lanes) : size;
  RankPieces mine{inner_->held_parameters(), counted_pieces()};
  lanes_ = std::make_unique<IslandLanes>(world_, lanes, mine, o_.fragments, p.fragments_of);
  for (int64_t f = 0; f < o_.fragments; ++f) {
    outer_.emplace_back(outer_options(o_), lanes_->lane_size(f));
    feedback_.emplace_back(lanes_->lane_size(f));
  }
  if (lanes_->lane() >= 0) {
    LinkOptions lo;
    lo.dir = o_.rendezvous;
    lo.island = static_cast<int>(o_.island);
    lo.islands = static_cast<int>(o_.islands);
    lo.lanes = lanes;
    lo.lane = lanes_->lane();
    lo.address = o_.address;
    lo.quorum_timeout_s = o_.quorum_timeout_s;
    lo.join_timeout_s = o_.join_timeout_s;
    lo.op_timeout_s = op_timeout_s_;
    link_ = std::make_unique<IslandLink>(lo);
  }
}

DilocoEngine::~DilocoEngine() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
}

std::vector<HeldPiece> DilocoEngine::counted_pieces() const {
  std::vector<HeldPiece> out;
  for (const HeldPiece& t : inner_->trained_pieces()) {
    if (auto part = counted_part(t, ctx_))
      out.push_back({t.name, t.param, part->first, part->second, t.placement});
  }
  return out;
}

Member DilocoEngine::me() const {
  Member m;
  m.island = static_cast<int>(o_.island);
  m.commits = commits_;
  m.joining = left_out_;
  m.digest = lanes_->model_digest();
  m.lanes = lanes_->lanes();
  return m;
}

void DilocoEngine::step(double lr, const Tensor& factor) {
  inner_->step(lr, factor);
  step_ = now_ ? now_().step : step_ + 1;  // the run's count (a skipped step counts too)
  if (pending_ && pending_->write_back_at == step_) {
    std::unique_ptr<Round> r = std::move(pending_);
    if (r->thread.joinable()) r->thread.join();
    conclude(*r);
  }
  for (int64_t f = 0; f < o_.fragments; ++f) {
    if (syncs_at(o_, step_, f) && step_ + o_.overlap_steps <= total_steps_) launch(f, step_);
  }
  if (step_ == total_steps_ && link_ && lanes_->lane() == 0) link_->finish();
}

// The round of fragment f after inner step `step`: the lanes' Δ = θ − φ, then the lanes' part
// (inline, or on a thread for τ > 0), then the write-back now or τ steps later.
void DilocoEngine::launch(int64_t f, int64_t step) {
  auto r = std::make_unique<Round>();
  r->fragment = f;
  r->launched_at = step;
  r->write_back_at = step + o_.overlap_steps;
  r->key = round_key(step, f);
  r->joining = left_out_;
  const std::vector<float> inner = lanes_->gather(f, counted_pieces());
  if (lanes_->lane() >= 0) {
    const std::vector<float>& outer = outer_[f].weights();
    r->delta.resize(inner.size());
    for (size_t i = 0; i < inner.size(); ++i) r->delta[i] = outer[i] - inner[i];
  }
  if (o_.overlap_steps == 0) {
    if (link_) run_round(*r);
    conclude(*r);
    return;
  }
  if (link_) {
    Round* raw = r.get();
    r->thread = std::thread([this, raw] { run_round(*raw); });
  }
  pending_ = std::move(r);
}

void DilocoEngine::run_round(Round& r) {
  const auto t0 = Clock::now();
  try {
    if (r.quorum.round.empty()) r.quorum = link_->form(r.key, me(), !met_);
    exchange(r);
  } catch (const std::exception& e) {  // the link, or the rendezvous directory: no commit here
    r.failure = e.what();
    r.commit = false;
    if (r.link) {
      try {
        r.link->conclude(false);
      } catch (const std::exception&) {
      }
    }
  }
  if (r.link) r.bytes = r.link->bytes_sent();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

// The exchange of one round on this lane: Σ of the contributors' Δ (f32 all-reduce, or the
// quantised Δ all-gathered and summed in island order), the vote, and on commit the outer step.
void DilocoEngine::exchange(Round& r) {
  const Quorum& q = r.quorum;
  const int island = static_cast<int>(o_.island);
  for (const Member& m : q.members) {
    if (m.digest != lanes_->model_digest() || m.lanes != lanes_->lanes()) {
      std::ostringstream os;
      os << "parallel.diloco: island " << m.island << " trains another model or lane count ("
         << m.lanes << " lanes) than island " << island << " (" << lanes_->lanes()
         << " lanes): the islands of a job need the same model.* and parallel.diloco.lanes";
      r.mismatch = os.str();
      return;
    }
  }
  r.in_quorum = q.index_of(island) >= 0;
  if (!r.in_quorum) return;
  r.contributes = q.contributes(island) && !r.joining;
  r.receives = q.receives_state(island) || r.joining;
  r.source = q.source == island;
  const int64_t f = r.fragment;
  const int n = q.contributors();
  std::vector<float> delta = r.contributes ? r.delta : std::vector<float>(lanes_->lane_size(f), 0);
  r.link = link_->open(q);
  std::vector<float> average(delta.size(), 0.0f);
  if (o_.bits() == 0) {
    r.link->all_reduce(delta);
    for (size_t i = 0; i < delta.size(); ++i) average[i] = delta[i] / static_cast<float>(n);
  } else {
    const int bits = o_.bits();
    auto block = [&](const LaneSegment& s) {
      return o_.quantize_scaling == "row" ? s.row : o_.quantize_block;
    };
    int64_t bytes = 0;
    for (const LaneSegment& s : lanes_->segments(f))
      bytes += quantized_bytes(s.end - s.begin, block(s), bits);
    std::vector<uint8_t> payload(static_cast<size_t>(bytes), 0);
    if (r.contributes) {
      ErrorFeedback trial = feedback_[f];
      if (!o_.error_feedback) trial.residual().assign(trial.residual().size(), 0.0f);
      int64_t at = 0;
      for (const LaneSegment& s : lanes_->segments(f)) {
        trial.compress(delta.data() + s.offset, s.offset, s.end - s.begin, block(s), bits,
                       payload.data() + at);
        at += quantized_bytes(s.end - s.begin, block(s), bits);
      }
      if (o_.error_feedback) r.trial_residual = std::move(trial.residual());
    }
    const std::vector<std::vector<uint8_t>> all = r.link->all_gather(payload);
    for (size_t m = 0; m < q.members.size(); ++m) {  // in island order: the same bits everywhere
      if (!q.contributes(q.members[m].island)) continue;
      int64_t at = 0;
      for (const LaneSegment& s : lanes_->segments(f)) {
        dequantize_add(all[m].data() + at, s.end - s.begin, block(s), bits,
                       average.data() + s.offset);
        at += quantized_bytes(s.end - s.begin, block(s), bits);
      }
    }
    for (float& v : average) v /= static_cast<float>(n);
  }
  r.commit = r.link->conclude(true);
  if (!r.commit) return;
  if (r.contributes) {
    outer_[f].step(average.data());
    if (!r.trial_residual.empty()) feedback_[f].residual() = std::move(r.trial_residual);
  }
}

// The round's end on every rank of the island, at its write-back step: lane 0's view of the
// outcome (every lane read the same outcome file), then the write-back, the state sent or
// received, the log line.
void DilocoEngine::conclude(Round& r) {
  const std::vector<int64_t> flags = island_broadcast(
      world_, {r.commit, r.in_quorum, r.contributes, r.receives, r.source, !r.mismatch.empty()});
  if (flags[5]) {
    throw ConfigError(!r.mismatch.empty() ? r.mismatch
                                          : "parallel.diloco: the islands do not train the same "
                                            "model (island rank 0's error says which)");
  }
  r.commit = flags[0];
  r.in_quorum = flags[1];
  r.contributes = flags[2];
  r.receives = flags[3];
  r.source = flags[4];
  ++totals_.rounds;
  totals_.bytes_sent += r.bytes;
  totals_.peak_round_bytes = std::max(totals_.peak_round_bytes, r.bytes);
  if (!r.in_quorum) {
    left_out_ = true;  // announces itself and takes the state in the next round
  } else if (!r.commit) {
    ++totals_.aborts;
    met_ = true;
  } else {
    ++totals_.commits;
    met_ = true;
    const int64_t f = r.fragment;
    if (r.contributes) {
      ++commits_;
      lanes_->scatter(f, outer_[f].weights(), o_.fragment_alpha, inner_->held_parameters());
    }
    if (r.source && r.link) {
      const RunPosition at = now_ ? now_() : RunPosition{step_, 0, 0};
      for (const Member& m : r.quorum.members) {
        if (!r.quorum.receives_state(m.island)) continue;
        try {
          r.link->send(m.island, pack_state(at));
        } catch (const LinkError& e) {
          r.failure = e.what();  // it takes the state in a later round
        }
      }
      if (lanes_->lane() == 0) link_->prune(8);
    }
    if (r.receives) receive_state(r, nullptr);
  }
  if (log_) *log_ << line(r) << "\n" << std::flush;
}

std::string DilocoEngine::line(const Round& r) const {
  std::ostringstream os;
  os << "diloco: round " << r.key << " (step " << r.launched_at << ", fragment " << r.fragment
     << "): ";
  if (!r.in_quorum) {
    os << "not let in (late or restarted): takes the state in the next round";
    return os.str();
  }
  os << "islands";
  for (size_t i = 0; i < r.quorum.members.size(); ++i)
    os << (i ? "," : " ") << r.quorum.members[i].island;
  os << " (" << r.quorum.contributors() << " contributing), "
     << (r.commit ? "committed" : "aborted") << ", " << std::fixed << std::setprecision(3)
     << static_cast<double>(r.bytes) / (1 << 20) << " MiB sent by rank 0, " << r.seconds << " s";
  if (r.receives && r.commit) os << ", state received from island " << r.quorum.source;
  if (!r.failure.empty()) os << " (" << r.failure << ")";
  return os.str();
}

size_t DilocoEngine::state_bytes() const {
  size_t n = 8 * (4 + outer_.size());
  for (const OuterOptimizer& o : outer_) n += 4 * (o.weights().size() + o.momentum().size());
  return n;
}

std::vector<uint8_t> DilocoEngine::pack_state(const RunPosition& at) const {
  std::vector<uint8_t> out;
  for (int64_t v : {commits_, at.step, at.data_epoch, at.data_position}) append(out, &v, 8);
  for (const OuterOptimizer& o : outer_) {
    const int64_t steps = o.steps();
    append(out, &steps, 8);
  }
  for (const OuterOptimizer& o : outer_) {
    append(out, o.weights().data(), 4 * o.weights().size());
    append(out, o.momentum().data(), 4 * o.momentum().size());
  }
  return out;
}

RunPosition DilocoEngine::unpack_state(const std::vector<uint8_t>& blob) {
  LOOM_CHECK(blob.size() == state_bytes(), "diloco: state of ", blob.size(), " bytes, expected ",
             state_bytes());
  const uint8_t* p = blob.data();
  auto take = [&p](void* dst, size_t n) {
    std::memcpy(dst, p, n);
    p += n;
  };
  RunPosition at;
  take(&commits_, 8);
  take(&at.step, 8);
  take(&at.data_epoch, 8);
  take(&at.data_position, 8);
  for (OuterOptimizer& o : outer_) {
    int64_t steps = 0;
    take(&steps, 8);
    o.set_steps(steps);
  }
  for (OuterOptimizer& o : outer_) {
    take(o.weights().data(), 4 * o.weights().size());
    take(o.momentum().data(), 4 * o.momentum().size());
  }
  return at;
}

// The source's state after the round (received on the lanes), written into every rank's
// pieces; the inner optimizer starts afresh. Returns false (nothing changed) when the transfer
// failed on any lane: the island takes the state in a later round.
bool DilocoEngine::receive_state(Round& r, RunPosition* position) {
  int64_t ok = 1;
  RunPosition at;
  if (r.link) {
    try {
      at = unpack_state(r.link->recv(r.quorum.source, state_bytes()));
    } catch (const LinkError& e) {
      r.failure = e.what();
      ok = 0;
    }
  }
  if (world_ != nullptr && world_->size() > 1) {
    Tensor t = Tensor::full({1}, static_cast<double>(1 - ok), DType::kI64);  // any lane failed
    world_->all_reduce(t, ReduceOp::kMax);
    ok = 1 - t.data<int64_t>()[0];
  }
  if (ok == 0) {
    left_out_ = true;
    return false;
  }
  const std::vector<int64_t> v =
      island_broadcast(world_, {commits_, at.step, at.data_epoch, at.data_position});
  commits_ = v[0];
  for (int64_t f = 0; f < o_.fragments; ++f) {
    lanes_->scatter(f, outer_[f].weights(), 0.0, inner_->held_parameters());
    feedback_[f].residual().assign(feedback_[f].residual().size(), 0.0f);
  }
  reset_inner_optimizer();
  left_out_ = false;
  if (position) *position = {v[1], v[2], v[3]};
  return true;
}

void DilocoEngine::reset_inner_optimizer() {
  for (auto& [name, t] : inner_->optimizer_state()) {
    Tensor dst = t;
    ops::copy_(dst, Tensor::zeros_like(t));
  }
  inner_->set_optimizer_steps(0);
}

std::optional<RunPosition> DilocoEngine::start(const RunPosition& here,
                                               std::function<RunPosition()> now) {
  now_ = std::move(now);
  step_ = here.step;
  if (!restored_) {  // θ starts as the initial (or init_from) weights
    for (int64_t f = 0; f < o_.fragments; ++f) {
      std::vector<float> w = lanes_->gather(f, counted_pieces());
      if (lanes_->lane() >= 0) outer_[f].weights() = std::move(w);
    }
  }
  const bool lead = link_ && lanes_->lane() == 0;
  const int64_t running = island_broadcast(world_, {lead && link_->job_running() ? 1 : 0})[0];
  if (running == 0) return std::nullopt;
  left_out_ = true;  // a running job: this island joins (Note [Quorum])
  while (true) {
    std::string key, failure;
    if (lead) {
      try {
        key = link_->join(me()).round;
      } catch (const LinkError& e) {
        failure = e.what();
      }
    }
    key = island_broadcast_text(world_, key);
    if (key.empty())
      throw LinkError(failure.empty() ? "diloco: island " + std::to_string(o_.island) +
                                            " could not join (island rank 0's error says why)"
                                      : failure);
    Round r;
    r.key = key;
    r.fragment = fragment_of_key(key);
    r.joining = true;
    if (link_) {
      try {
        r.quorum = link_->read(key);
      } catch (const LinkError& e) {
        r.failure = e.what();
      }
      if (r.failure.empty()) run_round(r);
    }
    const std::vector<int64_t> flags =
        island_broadcast(world_, {r.commit, r.in_quorum, !r.mismatch.empty()});
    if (flags[2]) {
      throw ConfigError(!r.mismatch.empty() ? r.mismatch
                                            : "parallel.diloco: the islands do not train the "
                                              "same model (island rank 0's error says which)");
    }
    met_ = true;
    RunPosition at;
    if (flags[0] && flags[1]) {
      r.commit = true;
      if (receive_state(r, &at)) {
        step_ = at.step;
        if (log_) {
          *log_ << "diloco: island " << o_.island << " joined the running islands in round " << key
                << " (state from island " << r.quorum.source << "): continues at step " << at.step
                << "\n"
                << std::flush;
        }
        return at;
      }
    }
    if (log_) *log_ << line(r) << "; trying the next round\n" << std::flush;
  }
}

// Note [Engine state] in parallel/engine.h: θ, the momentum and error feedback's residual of
// each fragment as pieces of one layout-free vector per fragment and kind
// ("diloco.f<fragment>.outer", ".momentum", ".residual": the fragment's elements in lane order,
// Note [Lanes] in parallel/diloco/island_lanes.h), this lane's range of it; a resume with other
// lanes reshards them (the model and the fragments must stay). A round still in flight (τ > 0)
// is waited for, and its write-back saved as counters.
std::vector<HeldPiece> DilocoEngine::engine_state() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
  staged_.clear();
  std::vector<HeldPiece> out;
  for (int64_t f = 0; f < o_.fragments; ++f) {
    const std::vector<std::pair<std::string, std::vector<float>*>> kinds = {
        {"outer", &outer_[f].weights()},
        {"momentum", &outer_[f].momentum()},
        {"residual", &feedback_[f].residual()}};
    for (const auto& [kind, values] : kinds) {
      if (values->empty() || (kind == "residual" && (o_.bits() == 0 || !o_.error_feedback)))
        continue;
      Tensor t = Tensor::from_vector(*values, {static_cast<int64_t>(values->size())});
      staged_.push_back(t);
      TensorPiece piece = whole_piece({lanes_->fragment_size(f)});
      piece.begin = lanes_->lane_begin(f);
      piece.end = piece.begin + t.numel();
      const std::string key = "diloco.f" + std::to_string(f) + "." + kind;
      out.push_back({key, key, t, piece, Placement{}});
    }
  }
  return out;
}

std::map<std::string, std::string> DilocoEngine::engine_counters() const {
  std::map<std::string, std::string> c = {{"diloco.commits", std::to_string(commits_)},
                                          {"diloco.met", met_ ? "1" : "0"},
                                          {"diloco.left_out", left_out_ ? "1" : "0"}};
  for (int64_t f = 0; f < o_.fragments; ++f)
    c["diloco.outer_steps." + std::to_string(f)] = std::to_string(outer_[f].steps());
  if (pending_) {
    const Round& r = *pending_;
    std::ostringstream os;
    os << r.fragment << ' ' << r.launched_at << ' ' << r.write_back_at << ' ' << r.commit << ' '
       << r.in_quorum << ' ' << r.contributes << ' ' << r.receives << ' ' << r.source;
    c["diloco.pending"] = os.str();
  }
  return c;
}

void DilocoEngine::restore_state(const std::map<std::string, std::string>& counters) {
  auto get = [&](const std::string& key) {
    auto it = counters.find(key);
    if (it == counters.end())
      throw ConfigError("parallel.diloco: the checkpoint has no '" + key +
                        "' (saved without DiLoCo?)");
    return it->second;
  };
  size_t k = 0;  // staged_ in engine_state()'s order
  for (int64_t f = 0; f < o_.fragments; ++f) {
    for (std::vector<float>* v :
         {&outer_[f].weights(), &outer_[f].momentum(), &feedback_[f].residual()}) {
      const bool residual = v == &feedback_[f].residual();
      if (v->empty() || (residual && (o_.bits() == 0 || !o_.error_feedback))) continue;
      const Tensor& t = staged_.at(k++);
      std::copy_n(t.data<float>(), v->size(), v->begin());
    }
    outer_[f].set_steps(std::stoll(get("diloco.outer_steps." + std::to_string(f))));
  }
  commits_ = std::stoll(get("diloco.commits"));
  met_ = get("diloco.met") == "1";
  left_out_ = get("diloco.left_out") == "1";
  if (auto it = counters.find("diloco.pending"); it != counters.end()) {
    auto r = std::make_unique<Round>();
    std::istringstream in(it->second);
    in >> r->fragment >> r->launched_at >> r->write_back_at >> r->commit >> r->in_quorum >>
        r->contributes >> r->receives >> r->source;
    r->key = round_key(r->launched_at, r->fragment);
    pending_ = std::move(r);  // no link: a state it owed another island is sent by no one
  }
  restored_ = true;
}

std::string DilocoEngine::describe() const {
  std::ostringstream os;
  os << "diloco: island " << o_.island << " of " << o_.islands << ", H " << o_.inner_steps
     << ", outer " << o_.outer;
  if (o_.outer != "average") os << " lr " << o_.outer_lr << " momentum " << o_.outer_momentum;
  if (o_.fragments > 1 || o_.overlap_steps > 0)
    os << ", streaming: " << o_.fragments << " fragments, overlap " << o_.overlap_steps
       << " steps, alpha " << o_.fragment_alpha;
  if (o_.bits() > 0)
    os << ", outer gradients " << o_.quantize << " (" << o_.quantize_scaling << " scaled"
       << (o_.error_feedback ? ", error feedback" : "") << ")";
  os << ", " << lanes_->lanes() << " lane" << (lanes_->lanes() > 1 ? "s" : "") << ", rendezvous "
     << o_.rendezvous;
  const std::string inner = inner_->describe();
  if (!inner.empty()) os << "\n" << inner;
  return os.str();
}

std::string DilocoEngine::describe_end() {
  int64_t bytes = totals_.bytes_sent, peak = totals_.peak_round_bytes;
  if (world_ != nullptr && world_->size() > 1) {
    Tensor b = Tensor::full({1}, static_cast<double>(bytes), DType::kI64);
    world_->all_reduce(b, ReduceOp::kSum);
    bytes = b.data<int64_t>()[0];
    Tensor p = Tensor::full({1}, static_cast<double>(peak), DType::kI64);
    world_->all_reduce(p, ReduceOp::kSum);  // the lanes' rounds are simultaneous
    peak = p.data<int64_t>()[0];
  }
  std::ostringstream os;
  os << "diloco: " << totals_.rounds << " rounds (" << totals_.commits << " committed, "
     << totals_.aborts << " aborted), " << std::fixed << std::setprecision(3)
     << static_cast<double>(bytes) / (1 << 20)
     << " MiB sent to other islands by this island (at most "
     << static_cast<double>(peak) / (1 << 20) << " MiB in one round)";
  const std::string inner = inner_->describe_end();
  return inner.empty() ? os.str() : os.str() + "; " + inner;
}

}  // namespace loom::parallel::diloco
