// train/planner/dp_backward.cpp — Note [Buckets on the link] (see train/planner/dp_backward.h).
#include "train/planner/dp_backward.h"

#include <algorithm>

namespace loom::planner {

BackwardSync simulate_backward_sync(const BackwardShape& s,
                                    const std::function<double(double)>& reduce) {
  BackwardSync out;
  double t = s.head_bwd, link = 0;  // the compute's clock; when the link is next free
  const auto launch = [&](double bytes, double at) {
    if (bytes <= 0) return;
    const double d = reduce(bytes);
    link = std::max(link, at) + d;
    out.busy += d;
  };
  if (s.overlap) launch(s.early_bytes, t);
  double filled = s.head_bytes;  // bytes in the bucket being filled
  const auto full = [&] {
    for (; s.overlap && s.bucket_bytes > 0 && filled >= s.bucket_bytes; filled -= s.bucket_bytes)
      launch(s.bucket_bytes, t);
  };
  full();
  for (int64_t b = 0; b < s.blocks; ++b) {
    if (s.ring_waits) {
      const double at = t + s.before_ring;
      out.ring_wait += std::max(0.0, link - at);
      t = std::max(link, at) + (s.block_bwd - s.before_ring);
    } else {
      t += s.block_bwd;
    }
    filled += s.block_bytes;
    full();
  }
  const double end = t;
  if (!s.overlap) launch(s.early_bytes, end);
  for (double left = filled + s.end_bytes; left > 0;) {
    const double n = s.bucket_bytes > 0 ? std::min(s.bucket_bytes, left) : left;
    launch(n, end);
    left -= n;
  }
  out.exposed = std::max(0.0, link - end);
  return out;
}

TableSync table_sync(const Config& cfg, int64_t tokens, double grad_bytes) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const int64_t C = m.n_embd, V = m.padded_vocab() / p.tp;
  const double table = static_cast<double>(V) * C * grad_bytes;
  // DataParallel's condition (parallel/dp/data_parallel.cpp), and a host table 8× taller than
  // wide; a pipeline's stages are priced without the shortcuts.
  const bool shortcuts = p.zero_stage <= 1 && p.overlap && p.table_shortcuts &&
                         cfg.train.device == "cpu" && p.pp == 1 && p.dp * p.cp > 1;
  const auto tall = [&](int64_t rows) { return shortcuts && rows >= 8 * C; };
  TableSync out;
  out.covered = m.tie_embeddings ? table : 2 * table;
  if (!m.tie_embeddings) out.head_bytes = table;  // the untied head's, when its backward ends
  if (!tall(V)) {
    out.end_bytes = table;  // the lookup's (a tied table's whole gradient) at the end
    return out;
  }
  // The head's dense gradient (tied: its contribution) in a bucket of its own; the lookup's by
  // rows where it proves sparse (at most half the rows), else whole at the end.
  out.early_bytes = table;
  out.head_bytes = 0;
  const int64_t used = std::min(V, tokens);
  if (2 * used <= V)
    out.rows.push_back({V, C, used, m.tie_embeddings});
  else
    out.end_bytes = table;
  const int64_t positions = m.arch == "gpt2" ? m.max_seq_len : 0;  // wpe
  const int64_t T = cfg.data.packing ? positions : std::min(positions, cfg.data.seq_len);
  if (tall(positions) && 2 * T <= positions) {
    out.rows.push_back({positions, C, T, false});
    out.covered += static_cast<double>(positions) * C * grad_bytes;
  }
  return out;
}

}  // namespace loom::planner
