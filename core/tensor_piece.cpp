// core/tensor_piece.cpp — piece geometry, its text form, and the overlap walk (Note [Pieces] in
// core/tensor_piece.h).
#include "core/tensor_piece.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace loom {
namespace {

// The runs of dim d, or one run covering the whole dim.
std::vector<PlacementRun> runs_or_whole(const TensorPiece& p, size_t d) {
  if (!p.runs[d].empty()) return p.runs[d];
  return {PlacementRun{0, 0, p.global_shape[d]}};
}

int64_t to_global(const std::vector<PlacementRun>& runs, int64_t local) {
  if (runs.empty()) return local;
  for (const PlacementRun& r : runs) {
    if (local >= r.local && local < r.local + r.length) return r.global + (local - r.local);
  }
  return -1;
}

int64_t to_local(const std::vector<PlacementRun>& runs, int64_t global) {
  if (runs.empty()) return global;
  for (const PlacementRun& r : runs) {
    if (global >= r.global && global < r.global + r.length) return r.local + (global - r.global);
  }
  return -1;
}

// Checks that the runs of every dim tile [0, local size) and stay inside the global dim.
// `input`: the piece came from a file (InputError), else from the code (Error).
void check_piece(const TensorPiece& p, const std::string& what, bool input) {
  auto check = [&](bool ok, const std::string& msg) {
    if (ok) return;
    if (input) throw InputError(what + ": " + msg, __FILE__, __LINE__);
    throw Error(what + ": " + msg, __FILE__, __LINE__);
  };
  check(
      p.runs.size() == p.global_shape.size(),
      detail::str("piece has ", p.runs.size(), " run lists for ", p.global_shape.size(), " dims"));
  for (size_t d = 0; d < p.runs.size(); ++d) {
    check(p.global_shape[d] >= 0, detail::str("negative global size in dim ", d));
    int64_t next_local = 0;
    for (const PlacementRun& r : p.runs[d]) {
      // A dim holds each global index once: its runs add up to at most the global size.
      check(r.local == next_local && r.length > 0 && r.global >= 0 &&
                r.length <= p.global_shape[d] && r.global <= p.global_shape[d] - r.length &&
                next_local <= p.global_shape[d] - r.length,
            detail::str("run ", r.local, "@", r.global, "+", r.length, " of dim ", d,
                        " does not fit the global size ", p.global_shape[d]));
      next_local += r.length;
    }
  }
  int64_t n = 1;  // the box's elements, refusing an overflow
  for (int64_t d : p.box_shape())
    check(!__builtin_mul_overflow(n, d, &n), "the piece is too large");
  check(
      p.begin >= 0 && p.begin <= p.end && p.end <= n,
      detail::str("flat range [", p.begin, ", ", p.end, ") outside the piece's ", n, " elements"));
}

int64_t parse_int(const std::string& s, const std::string& what) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LOOM_INPUT_CHECK(used == s.size() && !s.empty(), what, ": '", s, "' is not an integer");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

}  // namespace

Shape TensorPiece::box_shape() const {
  Shape s(global_shape.size());
  for (size_t d = 0; d < s.size(); ++d) {
    if (runs[d].empty()) {
      s[d] = global_shape[d];
      continue;
    }
    s[d] = 0;
    for (const PlacementRun& r : runs[d]) s[d] += r.length;
  }
  return s;
}

TensorPiece whole_piece(const Shape& global_shape) {
  TensorPiece p;
  p.global_shape = global_shape;
  p.runs.resize(global_shape.size());
  p.end = shape_numel(global_shape);
  return p;
}

TensorPiece piece_of(const Placement& pl, const Shape& local_shape, int64_t begin, int64_t end) {
  TensorPiece p;
  p.global_shape = pl.global_shape.empty() ? local_shape : Shape(pl.global_shape);
  LOOM_CHECK(p.global_shape.size() == local_shape.size(), "piece_of: placement ", placement_str(pl),
             " does not match the local shape ", shape_str(local_shape));
  p.runs.resize(local_shape.size());
  for (const PlacementSplit& s : pl.splits) {
    LOOM_CHECK(s.dim >= 0 && static_cast<size_t>(s.dim) < local_shape.size(),
               "piece_of: split dim ", s.dim, " out of range");
    p.runs[static_cast<size_t>(s.dim)] = s.runs;
    for (PlacementRun& r : p.runs[static_cast<size_t>(s.dim)]) r.counted = true;  // where, not who
  }
  const int64_t n = shape_numel(local_shape);
  p.begin = begin;
  p.end = end < 0 ? n : end;
  check_piece(p, "piece_of", false);
  LOOM_CHECK(p.box_shape() == local_shape, "piece_of: placement ", placement_str(pl),
             " describes a ", shape_str(p.box_shape()), " tensor, not ", shape_str(local_shape));
  return p;
}

HeldPiece held_whole(const std::string& param, const Tensor& t) {
  return {param, param, t, piece_of(t.placement(), t.shape()), t.placement()};
}

std::string piece_str(const TensorPiece& p) {
  std::ostringstream out;
  out << "shape=";
  for (size_t d = 0; d < p.global_shape.size(); ++d) out << (d ? "," : "") << p.global_shape[d];
  for (size_t d = 0; d < p.runs.size(); ++d) {
    if (p.runs[d].empty()) continue;
    out << ";d" << d << "=";
    for (size_t i = 0; i < p.runs[d].size(); ++i) {
      const PlacementRun& r = p.runs[d][i];
      out << (i ? "," : "") << r.local << "@" << r.global << "+" << r.length;
    }
  }
  out << ";flat=" << p.begin << "-" << p.end;
  return out.str();
}

TensorPiece parse_piece(const std::string& text, const std::string& what) {
  TensorPiece p;
  bool have_shape = false, have_flat = false;
  for (const std::string& field : split(text, ';')) {
    const size_t eq = field.find('=');
    LOOM_INPUT_CHECK(eq != std::string::npos, what, ": malformed piece '", text, "'");
    const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "shape") {
      if (!value.empty()) {
        for (const std::string& v : split(value, ',')) p.global_shape.push_back(parse_int(v, what));
      }
      p.runs.assign(p.global_shape.size(), {});
      have_shape = true;
    } else if (key == "flat") {
      const size_t dash = value.find('-');
      LOOM_INPUT_CHECK(dash != std::string::npos, what, ": malformed flat range '", value, "'");
      p.begin = parse_int(value.substr(0, dash), what);
      p.end = parse_int(value.substr(dash + 1), what);
      have_flat = true;
    } else if (key.size() > 1 && key[0] == 'd') {
      LOOM_INPUT_CHECK(have_shape, what, ": piece '", text, "' gives runs before its shape");
      const int64_t d = parse_int(key.substr(1), what);
      LOOM_INPUT_CHECK(d >= 0 && static_cast<size_t>(d) < p.runs.size(), what, ": run dim ", d,
                       " out of range in '", text, "'");
      for (const std::string& run : split(value, ',')) {
        const size_t at = run.find('@'), plus = run.find('+');
        LOOM_INPUT_CHECK(at != std::string::npos && plus != std::string::npos && at < plus, what,
                         ": malformed run '", run, "'");
        p.runs[static_cast<size_t>(d)].push_back(
            {parse_int(run.substr(0, at), what), parse_int(run.substr(at + 1, plus - at - 1), what),
             parse_int(run.substr(plus + 1), what)});
      }
    } else {
      LOOM_INPUT_FAIL(what, ": unknown field '", key, "' in piece '", text, "'");
    }
  }
  LOOM_INPUT_CHECK(have_shape && have_flat, what, ": piece '", text,
                   "' lacks its shape or flat range");
  check_piece(p, what, true);
  return p;
}

void for_each_overlap(const TensorPiece& src, const TensorPiece& dst,
                      const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  LOOM_CHECK(src.global_shape == dst.global_shape,
             "pieces of different tensors: ", shape_str(src.global_shape), " and ",
             shape_str(dst.global_shape));
  if (src.numel() == 0 || dst.numel() == 0) return;
  const size_t nd = dst.global_shape.size();
  if (nd == 0) {  // a scalar: both pieces hold its one element
    fn(0, 0, 1);
    return;
  }
  const Shape dbox = dst.box_shape(), sbox = src.box_shape();
  std::vector<int64_t> sstride(nd, 1);
  for (size_t d = nd - 1; d-- > 0;) sstride[d] = sstride[d + 1] * sbox[d + 1];
  const size_t last = nd - 1;
  const int64_t rowlen = dbox[last];
  const std::vector<PlacementRun> druns = runs_or_whole(dst, last);
  const std::vector<PlacementRun> sruns = runs_or_whole(src, last);
  std::vector<int64_t> coord(nd, 0);
  for (int64_t r = dst.begin / rowlen; r <= (dst.end - 1) / rowlen; ++r) {
    int64_t rem = r, src_row = 0;
    bool held = true;
    for (size_t d = last; d-- > 0;) {  // the row's coordinates in dims 0..nd-2
      coord[d] = rem % dbox[d];
      rem /= dbox[d];
    }
    for (size_t d = 0; d < last && held; ++d) {
      const int64_t sl = to_local(src.runs[d], to_global(dst.runs[d], coord[d]));
      held = sl >= 0;
      src_row += sl * sstride[d];
    }
    if (!held) continue;
    const int64_t row_start = r * rowlen;
    const int64_t c0 = std::max(dst.begin, row_start) - row_start;
    const int64_t c1 = std::min(dst.end, row_start + rowlen) - row_start;
    for (const PlacementRun& dr : druns) {
      const int64_t a = std::max(dr.local, c0), b = std::min(dr.local + dr.length, c1);
      if (a >= b) continue;
      const int64_t ga = dr.global + (a - dr.local), gb = ga + (b - a);
      for (const PlacementRun& sr : sruns) {
        const int64_t x = std::max(ga, sr.global), y = std::min(gb, sr.global + sr.length);
        if (x >= y) continue;
        const int64_t s_flat = src_row + sr.local + (x - sr.global);
        const int64_t s0 = std::max(s_flat, src.begin), s1 = std::min(s_flat + (y - x), src.end);
        if (s0 >= s1) continue;
        const int64_t d_flat = row_start + dr.local + (x - dr.global) + (s0 - s_flat);
        fn(s0 - src.begin, d_flat - dst.begin, s1 - s0);
      }
    }
  }
}

int64_t copy_overlap(const TensorPiece& src, const void* src_data, const TensorPiece& dst,
                     void* dst_data, size_t elem_bytes) {
  int64_t copied = 0;
  const auto* s = static_cast<const std::byte*>(src_data);
  auto* d = static_cast<std::byte*>(dst_data);
  for_each_overlap(src, dst, [&](int64_t si, int64_t di, int64_t n) {
    std::memcpy(d + static_cast<size_t>(di) * elem_bytes, s + static_cast<size_t>(si) * elem_bytes,
                static_cast<size_t>(n) * elem_bytes);
    copied += n;
  });
  return copied;
}

}  // namespace loom
