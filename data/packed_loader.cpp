// data/packed_loader.cpp — PackedLoader (Note [Packed steps] in data/packed_loader.h): the
// document list, the per-step split and packing, the rows with their positions and starts.
#include "data/packed_loader.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.h"

namespace loom {

BalanceMode parse_balance_mode(const std::string& name) {
  if (name == "none") return BalanceMode::kNone;
  if (name == "tokens") return BalanceMode::kTokens;
  if (name == "flops") return BalanceMode::kFlops;
  throw ConfigError("data.balance: '" + name + "' is not one of none, tokens, flops");
}

const char* balance_mode_name(BalanceMode mode) {
  switch (mode) {
    case BalanceMode::kNone:
      return "none";
    case BalanceMode::kTokens:
      return "tokens";
    case BalanceMode::kFlops:
      return "flops";
  }
  return "?";
}

std::vector<std::vector<int64_t>> split_step(const std::vector<int64_t>& lengths, int parts,
                                             BalanceMode balance, const SequenceCost& cost) {
  LOOM_CHECK(parts > 0, "split_step: parts must be positive, got ", parts);
  if (balance == BalanceMode::kNone) {
    const auto n = static_cast<int64_t>(lengths.size());
    LOOM_CHECK(n % parts == 0, "split_step: ", n, " documents do not split evenly over ", parts,
               " ranks");
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(parts));
    const int64_t b = n / parts;
    for (int p = 0; p < parts; ++p) {
      out[static_cast<size_t>(p)].resize(static_cast<size_t>(b));
      std::iota(out[static_cast<size_t>(p)].begin(), out[static_cast<size_t>(p)].end(), p * b);
    }
    return out;
  }
  return partition_balanced(lengths, parts,
                            balance == BalanceMode::kTokens ? SequenceCost{0.0, 1.0} : cost);
}

PackedLoader::PackedLoader(const std::vector<std::string>& shard_paths,
                           const PackingOptions& options)
    : opt_(options) {
  LOOM_CHECK(opt_.docs_per_rank > 0 && opt_.max_len > 0, "PackedLoader: docs_per_rank ",
             opt_.docs_per_rank, " and max_len ", opt_.max_len, " must be positive");
  LOOM_CHECK(opt_.max_tokens >= opt_.max_len, "PackedLoader: max_tokens ", opt_.max_tokens,
             " is below max_len ", opt_.max_len, " (a whole document must fit a micro-batch)");
  LOOM_CHECK(opt_.world_size > 0 && opt_.rank >= 0 && opt_.rank < opt_.world_size,
             "PackedLoader: rank ", opt_.rank, " is outside world_size ", opt_.world_size);
  LOOM_CHECK(!shard_paths.empty(), "PackedLoader: no shard files given");
  for (const std::string& p : shard_paths) {
    LOOM_INPUT_CHECK(has_document_index(p), p, ": no document index ", docs_path_for(p),
                     " beside it; data.packing reads document shards (prepare_data --format "
                     "chat writes them: docs/data.md)");
    shards_.emplace_back(p);
    const DocumentReader& r = shards_.back();
    if (opt_.vocab_size > 0) r.check_vocab(opt_.vocab_size);
    const auto s = static_cast<int32_t>(shards_.size() - 1);
    for (int64_t d = 0; d < r.num_docs(); ++d) {
      const int64_t n = std::min(r.doc_length(d), opt_.max_len + 1);
      if (n < 2) continue;
      docs_.push_back({s, d, n - 1});
      count_cut(r.doc_mask(d), n);
    }
  }
  const int64_t global = opt_.docs_per_rank * opt_.world_size;
  LOOM_INPUT_CHECK(static_cast<int64_t>(docs_.size()) >= global, opt_.key, ": the shards hold ",
                   docs_.size(), " documents of 2 tokens or more, fewer than one step's ", global,
                   " (data.batch_size ", opt_.docs_per_rank, " × ", opt_.world_size, " ranks)");
  LOOM_INPUT_CHECK(stats_.loss_tokens > 0, opt_.key, " (", shard_paths.front(),
                   shard_paths.size() > 1 ? " and the other shards" : "", "): none of the ",
                   stats_.documents, " documents keeps a loss token within data.seq_len ",
                   opt_.max_len, " (each is cut to its first ", opt_.max_len + 1, " tokens; ",
                   stats_.cut_loss_tokens,
                   " loss tokens lie past the cut): training would learn nothing; raise "
                   "data.seq_len or shorten what precedes the assistant's turns");
}

// Note [Loss tokens and the cut]: a document of `kept` tokens after the cut; its targets are
// tokens 1 … kept − 1 of the mask, the rest of the mask is lost.
void PackedLoader::count_cut(std::span<const uint8_t> mask, int64_t kept) {
  const auto at = mask.begin() + kept;
  const int64_t in = std::count(mask.begin() + 1, at, uint8_t{1});
  const int64_t out = std::count(at, mask.end(), uint8_t{1});
  ++stats_.documents;
  stats_.cut_documents += at != mask.end() ? 1 : 0;
  stats_.loss_tokens += in;
  stats_.cut_loss_tokens += out;
  stats_.no_loss_documents += in == 0 ? 1 : 0;
}

int64_t PackedLoader::steps_per_epoch() const {
  return num_documents() / (opt_.docs_per_rank * opt_.world_size);
}

void PackedLoader::set_state(LoaderState state) {
  LOOM_CHECK(state.epoch >= 0 && state.position >= 0 && state.position <= num_documents(),
             "PackedLoader::set_state: epoch ", state.epoch, " position ", state.position,
             " is outside this data's ", num_documents(),
             " documents (saved with other shards or another data.seq_len?)");
  epoch_ = state.epoch;
  position_ = state.position;
}

std::string PackedLoader::fingerprint() const {
  std::string out;
  for (const DocumentReader& r : shards_) {
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", r.token_checksum());
    out += (out.empty() ? "" : "; ") +
           fingerprint_entry(r.path(), std::to_string(r.num_tokens()) + " tokens, " +
                                           std::to_string(r.num_docs()) + " documents, checksum " +
                                           crc);
  }
  return out;
}

int64_t PackedLoader::loss_tokens(const Doc& d) const {
  const std::span<const uint8_t> mask =
      shards_[static_cast<size_t>(d.shard)].doc_mask(d.index).subspan(1, d.inputs);
  return std::count(mask.begin(), mask.end(), uint8_t{1});
}

MicroBatch PackedLoader::pack(const std::vector<int64_t>& step_docs,
                              const std::vector<int64_t>& members) const {
  MicroBatch mb;
  int64_t L = 0;
  for (int64_t m : members)
    L += docs_[static_cast<size_t>(step_docs[static_cast<size_t>(m)])].inputs;
  if (members.empty()) L = 1;  // padding: one ignored token
  mb.inputs = Tensor::empty({1, L}, DType::kI32);
  mb.targets = Tensor::empty({1, L}, DType::kI32);
  mb.positions = Tensor::empty({L}, DType::kI32);
  mb.doc_start = Tensor::empty({L}, DType::kI32);
  int32_t* in = mb.inputs.data<int32_t>();
  int32_t* tg = mb.targets.data<int32_t>();
  int32_t* pos = mb.positions.data<int32_t>();
  int32_t* start = mb.doc_start.data<int32_t>();
  if (members.empty()) {
    in[0] = 0;
    tg[0] = -100;
    pos[0] = 0;
    start[0] = 0;
    return mb;
  }
  int64_t at = 0;
  for (int64_t m : members) {
    const Doc& d = docs_[static_cast<size_t>(step_docs[static_cast<size_t>(m)])];
    const DocumentReader& r = shards_[static_cast<size_t>(d.shard)];
    const TokenSpan tok = r.doc_tokens(d.index);
    const std::span<const uint8_t> mask = r.doc_mask(d.index);
    for (int64_t i = 0; i < d.inputs; ++i) {
      in[at + i] = tok[i];
      const bool counted = mask[static_cast<size_t>(i + 1)] != 0;
      tg[at + i] = counted ? tok[i + 1] : -100;
      mb.loss_tokens += counted ? 1 : 0;
      pos[at + i] = static_cast<int32_t>(i);
      start[at + i] = static_cast<int32_t>(at);
    }
    at += d.inputs;
    ++mb.documents;
  }
  return mb;
}

PackedStep PackedLoader::next() {
  const int64_t global = opt_.docs_per_rank * opt_.world_size;
  if (position_ + global > num_documents()) {
    ++epoch_;
    position_ = 0;
  }
  if (perm_epoch_ != epoch_) {
    perm_ = loader_permutation(num_documents(), opt_.seed, epoch_);
    perm_epoch_ = epoch_;
  }
  std::vector<int64_t> step_docs(perm_.begin() + position_, perm_.begin() + position_ + global);
  position_ += global;

  std::vector<int64_t> lengths(step_docs.size());
  PackedStep step;
  for (size_t i = 0; i < step_docs.size(); ++i) {
    const Doc& d = docs_[static_cast<size_t>(step_docs[i])];
    lengths[i] = d.inputs;
    step.global_loss_tokens += loss_tokens(d);
    step.global_tokens += d.inputs;
  }
  const std::vector<std::vector<int64_t>> shares =
      split_step(lengths, opt_.world_size, opt_.balance, opt_.cost);
  const SequenceCost measure =
      opt_.balance == BalanceMode::kFlops ? opt_.cost : SequenceCost{0.0, 1.0};
  std::vector<std::vector<int64_t>> mine;
  int64_t most = 1;
  for (int r = 0; r < opt_.world_size; ++r) {
    const std::vector<int64_t>& share = shares[static_cast<size_t>(r)];
    int64_t tokens = 0;
    double cost = 0;
    for (int64_t i : share) {
      tokens += lengths[static_cast<size_t>(i)];
      cost += measure(lengths[static_cast<size_t>(i)]);
    }
    std::vector<std::vector<int64_t>> cut = cut_microbatches(share, lengths, opt_.max_tokens);
    step.rank_tokens.push_back(tokens);
    step.rank_cost.push_back(cost);
    step.rank_micro_batches.push_back(static_cast<int64_t>(cut.size()));
    most = std::max<int64_t>(most, static_cast<int64_t>(cut.size()));
    if (r == opt_.rank) mine = std::move(cut);
  }
  // At least one micro-batch; the largest count with equal_micro_batches (Note [Packed steps]).
  const auto want = static_cast<size_t>(opt_.equal_micro_batches ? most : 1);
  if (mine.size() < want) mine.resize(want);
  for (const std::vector<int64_t>& members : mine) step.micro.push_back(pack(step_docs, members));
  return step;
}

}  // namespace loom
