// parallel/diloco/island_lanes.cpp — the lanes' layout-free ranges and the island's moves to and
// from them (Note [Lanes] in the header).
#include "parallel/diloco/island_lanes.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/ops/view.h"
#include "parallel/comm/communicator.h"

namespace loom::parallel::diloco {
namespace {

constexpr int kTag = 0x3D1C;  // the lanes' messages on the island's world

// Every rank's text, all-gathered (lengths first, then the padded characters).
std::vector<std::string> all_gather_text(Communicator* world, const std::string& mine) {
  if (world == nullptr || world->size() == 1) return {mine};
  const int n = world->size();
  Tensor len = Tensor::full({1}, static_cast<double>(mine.size()), DType::kI64);
  Tensor lens = Tensor::empty({n}, DType::kI64);
  world->all_gather(len, lens);
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  Tensor chars = Tensor::zeros({std::max<int64_t>(longest, 1)}, DType::kI32);
  for (size_t i = 0; i < mine.size(); ++i)
    chars.data<int32_t>()[i] = static_cast<unsigned char>(mine[i]);
  Tensor all = Tensor::empty({n * chars.numel()}, DType::kI32);
  world->all_gather(chars, all);
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) {
    const int32_t* c = all.data<int32_t>() + r * chars.numel();
    for (int64_t i = 0; i < lens.data<int64_t>()[r]; ++i) out[r] += static_cast<char>(c[i]);
  }
  return out;
}

// Host f32 copy of a piece's values, in the piece's element order.
std::vector<float> host_values(const Tensor& values) {
  Tensor h = values.to(Device::cpu()).to(DType::kF32).contiguous();
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

}  // namespace

IslandLanes::IslandLanes(Communicator* world, int lanes, const RankPieces& mine, int64_t fragments,
                         const FragmentsOf& ranges)
    : world_(world), lanes_(lanes) {
  if (world_ != nullptr) {
    rank_ = world_->rank();
    size_ = world_->size();
  }
  LOOM_CHECK(lanes_ >= 1 && lanes_ <= size_, "diloco: ", lanes_, " lanes on ", size_, " ranks");
  lane_ = rank_ < lanes_ ? rank_ : -1;
  // Every rank's pieces, as text: "H|C <param>\t<piece>\t<fragment>:<begin>:<end>,…" a line.
  std::ostringstream os;
  for (const auto* list : {&mine.held, &mine.counted}) {
    for (const HeldPiece& p : *list) {
      os << (list == &mine.held ? 'H' : 'C') << ' ' << p.param << '\t' << piece_str(p.piece)
         << '\t';
      for (const FragmentRange& r : ranges(p.param, p.piece.global_shape))
        os << r.fragment << ':' << r.begin << ':' << r.end << ',';
      os << '\n';
    }
  }
  held_.resize(size_);
  counted_.resize(size_);
  const std::vector<std::string> texts = all_gather_text(world_, os.str());
  struct Param {
    Shape shape;
    std::vector<FragmentRange> ranges;
  };
  std::map<std::string, Param> params;  // sorted by name
  for (int r = 0; r < size_; ++r) {
    std::istringstream in(texts[r]);
    std::string line;
    while (std::getline(in, line)) {
      const size_t tab = line.find('\t'), tab2 = line.find('\t', tab + 1);
      Desc d;
      d.param = line.substr(2, tab - 2);
      d.piece = parse_piece(line.substr(tab + 1, tab2 - tab - 1),
                            "diloco lanes: rank " + std::to_string(r));
      Param& p = params[d.param];
      p.shape = d.piece.global_shape;
      p.ranges.clear();
      std::istringstream rs(line.substr(tab2 + 1));
      FragmentRange fr;
      char c1 = 0, c2 = 0, comma = 0;
      while (rs >> fr.fragment >> c1 >> fr.begin >> c2 >> fr.end >> comma) p.ranges.push_back(fr);
      (line[0] == 'H' ? held_ : counted_)[r].push_back(std::move(d));
    }
  }
  // The fragments' sizes and every lane's segments (names sorted: the map's order).
  fragment_size_.assign(fragments, 0);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over names, shapes and fragments
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  for (const auto& [name, p] : params) {
    mix(name);
    for (int64_t d : p.shape) mix(std::to_string(d));
    for (const FragmentRange& r : p.ranges) {
      LOOM_CHECK(r.fragment >= 0 && r.fragment < fragments, "diloco: '", name, "' in fragment ",
                 r.fragment);
      fragment_size_[r.fragment] += r.end - r.begin;
      mix(std::to_string(r.fragment));
      mix(std::to_string(r.begin));
    }
  }
  digest_ = h;
  all_segments_.assign(lanes_, std::vector<std::vector<LaneSegment>>(fragments));
  for (int64_t f = 0; f < fragments; ++f) {
    const int64_t n = fragment_size_[f];
    int64_t at = 0;  // the range's start in the fragment
    for (const auto& [name, p] : params) {
      const int64_t row = p.shape.empty() ? 1 : p.shape.back();
      for (const FragmentRange& r : p.ranges) {
        if (r.fragment != f) continue;
        const int64_t len = r.end - r.begin;
        for (int l = 0; l < lanes_; ++l) {
          const int64_t lo = n * l / lanes_, hi = n * (l + 1) / lanes_;
          const int64_t b = std::max(lo, at), e = std::min(hi, at + len);
          if (b >= e) continue;
          std::vector<LaneSegment>& segs = all_segments_[l][f];
          const int64_t offset =
              segs.empty() ? 0 : segs.back().offset + segs.back().end - segs.back().begin;
          segs.push_back({name, p.shape, r.begin + b - at, r.begin + e - at, offset, row});
        }
        at += len;
      }
    }
  }
  segments_ = lane_ >= 0 ? all_segments_[lane_] : std::vector<std::vector<LaneSegment>>(fragments);
  fragment_params_.resize(fragments);
  for (const auto& [name, p] : params) {
    for (const FragmentRange& r : p.ranges) fragment_params_[r.fragment].insert(name);
  }
}

int64_t IslandLanes::lane_size(int64_t f) const {
  const std::vector<LaneSegment>& s = segments_[f];
  return s.empty() ? 0 : s.back().offset + s.back().end - s.back().begin;
}

void IslandLanes::walk(const std::vector<Desc>& pieces, int lane, int64_t f,
                       const std::function<void(size_t, int64_t, int64_t, int64_t)>& fn) const {
  const std::vector<LaneSegment>& segs = all_segments_[lane][f];
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Desc& d = pieces[i];
    for (const LaneSegment& s : segs) {
      if (s.param != d.param) continue;
      TensorPiece range = whole_piece(d.piece.global_shape);
      range.begin = s.begin;
      range.end = s.end;
      for_each_overlap(d.piece, range, [&](int64_t src, int64_t dst, int64_t count) {
        fn(i, src, s.offset + dst, count);
      });
    }
  }
}

std::vector<float> IslandLanes::gather(int64_t f, const std::vector<HeldPiece>& counted) {
  LOOM_CHECK(counted.size() == counted_[rank_].size(), "diloco lanes: ", counted.size(),
             " counted pieces, ", counted_[rank_].size(), " at construction");
  std::vector<std::vector<float>> host(counted.size());
  for (size_t i = 0; i < counted.size(); ++i) {
    if (touches(counted_[rank_][i], f)) host[i] = host_values(counted[i].values);
  }
  std::vector<float> lane(lane_ >= 0 ? static_cast<size_t>(lane_size(f)) : 0);
  std::vector<P2P> ops;
  std::vector<std::pair<int, Tensor>> recvs;
  for (int l = 0; l < lanes_; ++l) {  // what this rank sends to each lane
    std::vector<float> out;
    walk(counted_[rank_], l, f, [&](size_t i, int64_t src, int64_t, int64_t count) {
      out.insert(out.end(), host[i].begin() + src, host[i].begin() + src + count);
    });
    if (l == lane_) {
      walk(counted_[rank_], l, f, [&](size_t i, int64_t src, int64_t dst, int64_t count) {
        std::copy_n(host[i].begin() + src, count, lane.begin() + dst);
      });
    } else if (!out.empty()) {
      ops.push_back(
          P2P::send(Tensor::from_vector(out, {static_cast<int64_t>(out.size())}), l, kTag));
    }
  }
  if (lane_ >= 0) {  // what this lane receives from each other rank
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      int64_t n = 0;
      walk(counted_[r], lane_, f, [&](size_t, int64_t, int64_t, int64_t count) { n += count; });
      if (n == 0) continue;
      Tensor buf = Tensor::empty({n}, DType::kF32);
      ops.push_back(P2P::recv(buf, r, kTag));
      recvs.emplace_back(r, buf);
    }
  }
  if (!ops.empty()) {
    for (WorkPtr& w : world_->send_recv_async(std::move(ops))) w->wait();
  }
  for (auto& [r, buf] : recvs) {
    const float* v = buf.data<float>();
    walk(counted_[r], lane_, f, [&](size_t, int64_t, int64_t dst, int64_t count) {
      std::copy_n(v, count, lane.begin() + dst);
      v += count;
    });
  }
  return lane;
}

void IslandLanes::scatter(int64_t f, const std::vector<float>& values, double alpha,
                          const std::vector<HeldPiece>& held) {
  LOOM_CHECK(held.size() == held_[rank_].size(), "diloco lanes: ", held.size(), " held pieces, ",
             held_[rank_].size(), " at construction");
  // The pieces' own values, the fragment's elements replaced (mixed) as they arrive.
  std::vector<std::vector<float>> own(held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    if (touches(held_[rank_][i], f)) own[i] = host_values(held[i].values);
  }
  auto put = [&](size_t i, int64_t local, const float* v, int64_t count) {
    float* o = own[i].data() + local;
    if (alpha == 0) {
      std::copy_n(v, count, o);
      return;
    }
    for (int64_t k = 0; k < count; ++k)
      o[k] = static_cast<float>(alpha * o[k] + (1 - alpha) * static_cast<double>(v[k]));
  };
  std::vector<P2P> ops;
  std::vector<std::pair<int, Tensor>> recvs;
  if (lane_ >= 0) {  // what this lane sends to each rank
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) {
        walk(held_[r], lane_, f, [&](size_t i, int64_t local, int64_t at, int64_t count) {
          put(i, local, values.data() + at, count);
        });
        continue;
      }
      std::vector<float> out;
      walk(held_[r], lane_, f, [&](size_t, int64_t, int64_t at, int64_t count) {
        out.insert(out.end(), values.begin() + at, values.begin() + at + count);
      });
      if (!out.empty()) {
        ops.push_back(
            P2P::send(Tensor::from_vector(out, {static_cast<int64_t>(out.size())}), r, kTag));
      }
    }
  }
  for (int l = 0; l < lanes_; ++l) {  // what this rank receives from each other lane
    if (l == lane_) continue;
    int64_t n = 0;
    walk(held_[rank_], l, f, [&](size_t, int64_t, int64_t, int64_t count) { n += count; });
    if (n == 0) continue;
    Tensor buf = Tensor::empty({n}, DType::kF32);
    ops.push_back(P2P::recv(buf, l, kTag));
    recvs.emplace_back(l, buf);
  }
  if (!ops.empty()) {
    for (WorkPtr& w : world_->send_recv_async(std::move(ops))) w->wait();
  }
  for (auto& [l, buf] : recvs) {
    const float* v = buf.data<float>();
    walk(held_[rank_], l, f, [&](size_t i, int64_t local, int64_t, int64_t count) {
      put(i, local, v, count);
      v += count;
    });
  }
  for (size_t i = 0; i < held.size(); ++i) {
    if (own[i].empty()) continue;
    Tensor dst = held[i].values;
    ops::copy_(dst, Tensor::from_vector(own[i], dst.shape()).to(dst.dtype()).to(dst.device()));
  }
}

bool IslandLanes::touches(const Desc& d, int64_t f) const {
  return fragment_params_[f].count(d.param) > 0;
}

}  // namespace loom::parallel::diloco
