// parallel/diloco/island_link.cpp — the rendezvous files and Gloo's collectives between islands
// (Note [Quorum] in the header).
#include "parallel/diloco/island_link.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace loom::parallel::diloco {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(5);

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Makes `path` hold `text` if it does not exist yet: written aside, then link(2)ed into place,
// which fails when the name exists. Returns whether this call made it.
bool publish(const fs::path& path, const std::string& text) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  const fs::path tmp =
      path.parent_path() / (".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(rng()));
  {
    std::ofstream out(tmp);
    out << text;
    if (!out.flush()) throw LinkError("diloco: cannot write " + tmp.string());
  }
  const bool made = ::link(tmp.c_str(), path.c_str()) == 0;
  const int err = errno;
  fs::remove(tmp);
  if (!made && err != EEXIST)
    throw LinkError("diloco: cannot publish " + path.string() + ": " + std::strerror(err));
  return made;
}

std::string member_text(const Member& m) {
  std::ostringstream os;
  os << m.island << ' ' << m.commits << ' ' << (m.joining ? 1 : 0) << ' ' << m.digest << ' '
     << m.lanes << '\n';
  return os.str();
}

std::optional<Member> parse_member(const std::string& text) {
  std::istringstream in(text);
  Member m;
  int joining = 0;
  if (!(in >> m.island >> m.commits >> joining >> m.digest >> m.lanes)) return std::nullopt;
  m.joining = joining != 0;
  return m;
}

// This host's address for Gloo: the first IPv4 address of an interface that is up and not the
// loopback, else the loopback's.
std::string host_address() {
  ifaddrs* list = nullptr;
  std::string found = "127.0.0.1";
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf) != nullptr) {
      found = buf;
      break;
    }
  }
  ::freeifaddrs(list);
  return found;
}

std::vector<int> announced_joiners(const fs::path& dir) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("joining-", 0) == 0) out.push_back(std::stoi(name.substr(8)));
  }
  return out;
}

std::optional<Quorum> read_quorum(const fs::path& round, const std::string& key) {
  const std::optional<std::string> text = read_text(round / "quorum");
  if (!text) return std::nullopt;
  Quorum q;
  q.round = key;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("source ", 0) == 0) {
      q.source = std::stoi(line.substr(7));
    } else if (auto m = parse_member(line)) {
      q.members.push_back(*m);
    }
  }
  return q;
}

}  // namespace

int Quorum::index_of(int island) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].island == island) return static_cast<int>(i);
  return -1;
}

const Member& Quorum::member(int island) const {
  const int i = index_of(island);
  LOOM_CHECK(i >= 0, "diloco: island ", island, " is not in round ", round);
  return members[i];
}

bool Quorum::contributes(int island) const {
  const int i = index_of(island);
  return i >= 0 && !members[i].joining && members[i].commits == member(source).commits;
}

int Quorum::contributors() const {
  int n = 0;
  for (const Member& m : members) n += contributes(m.island) ? 1 : 0;
  return n;
}

IslandLink::IslandLink(LinkOptions o) : o_(std::move(o)) {
  std::error_code ec;
  fs::create_directories(fs::path(o_.dir) / "rounds", ec);
  LOOM_CONFIG_CHECK(!ec, "parallel.diloco.rendezvous: cannot create ", o_.dir, ": ", ec.message());
  for (const auto& e : fs::directory_iterator(o_.dir)) {
    LOOM_CONFIG_CHECK(e.path().filename().string().rfind("finished-", 0) != 0,
                      "parallel.diloco.rendezvous: ", o_.dir,
                      " belongs to a job that has finished; give this job a directory of its own");
  }
  for (int i = 0; i < o_.islands; ++i) expected_.push_back(i);
  if (o_.lane >= 0) {
    gloo::transport::tcp::attr attr;
    attr.hostname = o_.address.empty() ? host_address() : o_.address;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw ConfigError("parallel.diloco.address: cannot listen on '" + attr.hostname +
                        "' for the links between islands");
    }
  }
}

IslandLink::~IslandLink() = default;

std::string IslandLink::round_dir(const std::string& key) const {
  return (fs::path(o_.dir) / "rounds" / key).string();
}

bool IslandLink::job_running() const {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(o_.dir) / "rounds", ec)) {
    if (read_text(e.path() / "outcome").value_or("") == "commit") return true;
  }
  return false;
}

Quorum IslandLink::form(const std::string& key, const Member& me, bool expect_all) {
  const fs::path round = round_dir(key);
  fs::create_directories(round);
  const double wait_s = expect_all ? o_.join_timeout_s : o_.quorum_timeout_s;
  if (o_.lane != 0) return read(key);  // the island's lane 0 speaks for it
  if (me.joining) publish(fs::path(o_.dir) / ("joining-" + std::to_string(o_.island)), "joining\n");
  publish(round / ("member-" + std::to_string(o_.island)), member_text(me));
  std::vector<int> expected = expected_;
  for (int j : announced_joiners(o_.dir)) {
    if (std::find(expected.begin(), expected.end(), j) == expected.end()) expected.push_back(j);
  }
  const auto deadline = after(wait_s);
  while (!fs::exists(round / "quorum")) {
    const bool all = std::all_of(expected.begin(), expected.end(), [&](int i) {
      return fs::exists(round / ("member-" + std::to_string(i)));
    });
    if (all || Clock::now() >= deadline) {
      Quorum q;
      std::ostringstream os;
      for (const auto& e : fs::directory_iterator(round)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("member-", 0) != 0) continue;
        if (auto m = parse_member(read_text(e.path()).value_or(""))) q.members.push_back(*m);
      }
      std::sort(q.members.begin(), q.members.end(),
                [](const Member& a, const Member& b) { return a.island < b.island; });
      int source = -1;
      for (const Member& m : q.members) {
        if (m.joining) continue;
        if (source < 0 || m.commits > q.member(source).commits) source = m.island;
      }
      for (const Member& m : q.members) os << member_text(m);
      os << "source " << source << '\n';
      publish(round / "quorum", os.str());
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  Quorum q = *read_quorum(round, key);
  if (q.index_of(o_.island) >= 0) {
    expected_.clear();
    for (const Member& m : q.members) expected_.push_back(m.island);
    fs::remove(fs::path(o_.dir) / ("joining-" + std::to_string(o_.island)));
  }
  // The joiners this quorum left out stay announced; those it let in are expected from now on.
  return q;
}

Quorum IslandLink::read(const std::string& key) {
  const fs::path round = round_dir(key);
  const auto deadline = after(o_.join_timeout_s + o_.op_timeout_s);
  while (Clock::now() < deadline) {
    if (auto q = read_quorum(round, key)) return *q;
    std::this_thread::sleep_for(kPoll);
  }
  throw LinkError("diloco: round " + key + "'s quorum did not appear");
}

Quorum IslandLink::join(const Member& me) {
  const fs::path dir(o_.dir);
  publish(dir / ("joining-" + std::to_string(o_.island)), "joining\n");
  const auto deadline = after(o_.join_timeout_s);
  std::string tried;
  while (Clock::now() < deadline) {
    // The newest round still forming (no quorum yet) that this island has not tried.
    std::vector<std::string> keys;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir / "rounds", ec))
      keys.push_back(e.path().filename().string());
    std::sort(keys.begin(), keys.end());
    if (!keys.empty() && keys.back() > tried &&
        !fs::exists(dir / "rounds" / keys.back() / "quorum")) {
      const std::string key = keys.back();
      tried = key;
      const fs::path round = dir / "rounds" / key;
      publish(round / ("member-" + std::to_string(o_.island)), member_text(me));
      const auto q_deadline = after(o_.quorum_timeout_s + o_.op_timeout_s);
      std::optional<Quorum> q;
      while (!(q = read_quorum(round, key)) && Clock::now() < q_deadline)
        std::this_thread::sleep_for(kPoll);
      if (q && q->index_of(o_.island) >= 0) {
        expected_.clear();
        for (const Member& m : q->members) expected_.push_back(m.island);
        return *q;
      }
      continue;
    }
    std::this_thread::sleep_for(kPoll);
  }
  throw LinkError("diloco: island " + std::to_string(o_.island) + " found no running island to " +
                  "join within parallel.diloco.join_timeout_s " +
                  std::to_string(o_.join_timeout_s) + " s (rendezvous " + o_.dir +
                  "; a whole job restarting from checkpoints needs a " +
                  "new rendezvous directory)");
}

std::unique_ptr<LaneRound> IslandLink::open(const Quorum& q) {
  return std::make_unique<LaneRound>(*this, q);
}

void IslandLink::prune(size_t keep) {
  std::vector<fs::path> rounds;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(o_.dir) / "rounds", ec))
    rounds.push_back(e.path());
  std::sort(rounds.begin(), rounds.end());
  for (size_t i = 0; i + keep < rounds.size(); ++i) fs::remove_all(rounds[i], ec);
}

void IslandLink::finish() {
  publish(fs::path(o_.dir) / ("finished-" + std::to_string(o_.island)), "finished\n");
}

LaneRound::LaneRound(IslandLink& link, const Quorum& q) : link_(link), q_(q) {
  if (size() == 1) return;
  const LinkOptions& o = link_.o_;
  const fs::path store_dir =
      fs::path(link_.round_dir(q.round)) / ("gloo-" + std::to_string(o.lane));
  fs::create_directories(store_dir);
  try {
    gloo::rendezvous::FileStore store(store_dir.string());
    auto ctx = std::make_shared<gloo::rendezvous::Context>(q.index_of(o.island), size());
    ctx->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(o.op_timeout_s * 1000)));
    ctx->connectFullMesh(store, link_.device_);
    ctx_ = ctx;
  } catch (const std::exception& e) {
    throw LinkError("diloco: round " + q.round + ", lane " + std::to_string(o.lane) +
                    ": could not connect to the other islands (" + e.what() + ")");
  }
}

LaneRound::~LaneRound() = default;

void LaneRound::all_reduce(std::vector<float>& v) {
  if (size() == 1 || v.empty()) return;
  try {
    gloo::AllreduceOptions opts(ctx_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setOutput(v.data(), v.size());
    opts.setReduceFunction([](void* c, const void* a, const void* b, size_t n) {
      float* out = static_cast<float*>(c);
      const float* x = static_cast<const float*>(a);
      const float* y = static_cast<const float*>(b);
      for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
    });
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    throw LinkError("diloco: round " + q_.round + ": all-reduce between islands failed (" +
                    e.what() + ")");
  }
  // The ring sends (n−1)/n of the vector twice (reduce-scatter, then all-gather).
  bytes_sent_ += static_cast<int64_t>(2 * (size() - 1) * v.size() * sizeof(float) / size());
}

std::vector<std::vector<uint8_t>> LaneRound::all_gather(const std::vector<uint8_t>& mine) {
  if (size() == 1) return {mine};
  std::vector<uint8_t> all(mine.size() * size());
  if (!mine.empty()) {
    try {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(const_cast<uint8_t*>(mine.data()), mine.size());
      opts.setOutput(all.data(), all.size());
      opts.setTag(tag_++);
      gloo::allgather(opts);
    } catch (const std::exception& e) {
      throw LinkError("diloco: round " + q_.round + ": all-gather between islands failed (" +
                      e.what() + ")");
    }
  }
  bytes_sent_ += static_cast<int64_t>((size() - 1) * mine.size());  // the ring passes n−1 on
  std::vector<std::vector<uint8_t>> out(size());
  for (int i = 0; i < size(); ++i)
    out[i].assign(all.begin() + i * mine.size(), all.begin() + (i + 1) * mine.size());
  return out;
}

void LaneRound::send(int island, const std::vector<uint8_t>& bytes) {
  try {
    auto buf = ctx_->createUnboundBuffer(const_cast<uint8_t*>(bytes.data()), bytes.size());
    buf->send(q_.index_of(island), 0xD1);
    buf->waitSend(ctx_->getTimeout());
  } catch (const std::exception& e) {
    throw LinkError("diloco: round " + q_.round + ": sending the state to island " +
                    std::to_string(island) + " failed (" + e.what() + ")");
  }
  bytes_sent_ += static_cast<int64_t>(bytes.size());
}

std::vector<uint8_t> LaneRound::recv(int island, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  try {
    auto buf = ctx_->createUnboundBuffer(out.data(), out.size());
    buf->recv(q_.index_of(island), 0xD1);
    buf->waitRecv(ctx_->getTimeout());
  } catch (const std::exception& e) {
    throw LinkError("diloco: round " + q_.round + ": receiving the state from island " +
                    std::to_string(island) + " failed (" + e.what() + ")");
  }
  return out;
}

bool LaneRound::conclude(bool ok) {
  const LinkOptions& o = link_.o_;
  if (size() == 1) return ok;
  const fs::path round = link_.round_dir(q_.round);
  publish(round / ("vote-" + std::to_string(o.island) + "-" + std::to_string(o.lane)),
          ok ? "ok" : "fail");
  const auto deadline = after(o.op_timeout_s);
  while (!fs::exists(round / "outcome")) {
    bool all = true, failed = false;
    for (const Member& m : q_.members) {
      for (int l = 0; l < o.lanes; ++l) {
        const auto v =
            read_text(round / ("vote-" + std::to_string(m.island) + "-" + std::to_string(l)));
        if (!v)
          all = false;
        else if (*v != "ok")
          failed = true;
      }
    }
    if (failed || Clock::now() >= deadline) {
      publish(round / "outcome", "abort");
    } else if (all) {
      publish(round / "outcome", "commit");
    } else {
      std::this_thread::sleep_for(kPoll);
    }
  }
  return read_text(round / "outcome").value_or("") == "commit";
}

}  // namespace loom::parallel::diloco
