// tests/data/packed_loader_test.cpp — PackedLoader (Note [Packed steps]): the step's documents
// are the world-size-1 step's, split without loss or overlap; each packed row holds its
// documents' tokens with restarting positions, document starts and masked targets; micro-batches
// respect the token budget; balancing evens the ranks' costs; padding to equal counts; resume;
// the errors that name the file.
#include "data/packed_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"

namespace loom {
namespace {
namespace fs = std::filesystem;

// Documents with long-tailed lengths; token t of document d is (d·7 + t) % 97 + 1 except the
// first (100 + d), which identifies the document; the mask is 1 on the second half.
struct Corpus {
  std::string path;
  std::vector<std::vector<int32_t>> docs;
  std::vector<std::vector<uint8_t>> masks;
};

Corpus make_corpus(const std::string& name, int64_t count) {
  Corpus c;
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  c.path = (dir / "train_000000.bin").string();
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets = {0};
  uint32_t x = 3;
  for (int64_t d = 0; d < count; ++d) {
    x = x * 1103515245u + 12345u;
    const double u = (static_cast<double>((x >> 8) % 1000) + 1.0) / 1000.0;
    const int64_t n = d % 10 == 9 ? 1 : std::min<int64_t>(90, 2 + static_cast<int64_t>(3.0 / u));
    std::vector<int32_t> doc;
    std::vector<uint8_t> m;
    for (int64_t t = 0; t < n; ++t) {
      doc.push_back(static_cast<int32_t>(t == 0 ? 100 + d : (d * 7 + t) % 97 + 1));
      m.push_back(t > 0 && t >= n / 2 ? 1 : 0);
    }
    tokens.insert(tokens.end(), doc.begin(), doc.end());
    mask.insert(mask.end(), m.begin(), m.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
    c.docs.push_back(doc);
    c.masks.push_back(m);
  }
  write_document_shard(c.path, tokens, mask, offsets);
  return c;
}

PackingOptions options(int rank, int world, BalanceMode balance) {
  PackingOptions o;
  o.docs_per_rank = 6;
  o.max_len = 48;
  o.max_tokens = 64;
  o.balance = balance;
  o.cost = {0.5, 10.0};
  o.rank = rank;
  o.world_size = world;
  o.seed = 5;
  o.vocab_size = 1024;
  return o;
}

// The documents of a packed row, recovered from its starts, as (inputs, targets) sequences.
std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> unpack(const MicroBatch& mb) {
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> out;
  const int64_t L = mb.tokens();
  const int32_t* in = mb.inputs.data<int32_t>();
  const int32_t* tg = mb.targets.data<int32_t>();
  const int32_t* pos = mb.positions.data<int32_t>();
  const int32_t* start = mb.doc_start.data<int32_t>();
  for (int64_t i = 0; i < L; ++i) {
    EXPECT_EQ(pos[i], i - start[i]) << "position of row " << i;
    if (start[i] == i) out.emplace_back();
    EXPECT_FALSE(out.empty());
    out.back().first.push_back(in[i]);
    out.back().second.push_back(tg[i]);
  }
  return out;
}

// (inputs, targets) of corpus document d as the loader should give it: cut to max_len + 1.
std::pair<std::vector<int32_t>, std::vector<int32_t>> expected(const Corpus& c, size_t d,
                                                               int64_t max_len) {
  const auto n = std::min<size_t>(c.docs[d].size(), static_cast<size_t>(max_len + 1));
  std::pair<std::vector<int32_t>, std::vector<int32_t>> e;
  for (size_t t = 0; t + 1 < n; ++t) {
    e.first.push_back(c.docs[d][t]);
    e.second.push_back(c.masks[d][t + 1] ? c.docs[d][t + 1] : -100);
  }
  return e;
}

// Which corpus document an unpacked sequence is (its tokens identify it).
size_t identify(const Corpus& c, const std::vector<int32_t>& inputs) {
  for (size_t d = 0; d < c.docs.size(); ++d)
    if (!inputs.empty() && c.docs[d][0] == inputs[0]) return d;
  ADD_FAILURE() << "a packed sequence matches no document";
  return 0;
}

TEST(PackedLoader, RanksSplitTheSingleProcessStepIntoCorrectRows) {
  const Corpus c = make_corpus("packed_split", 300);
  for (BalanceMode balance : {BalanceMode::kNone, BalanceMode::kTokens, BalanceMode::kFlops}) {
    PackedLoader single(std::vector<std::string>{c.path}, [&] {
      PackingOptions o = options(0, 1, balance);
      o.docs_per_rank = 24;
      return o;
    }());
    std::vector<PackedLoader> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back(std::vector<std::string>{c.path}, options(r, 4, balance));
    EXPECT_EQ(single.num_documents(), 270);  // every tenth document has 1 token: left out
    for (int step = 0; step < 13; ++step) {  // 270 / 24 = 11 steps per epoch: rolls over
      const PackedStep whole = single.next();
      std::multiset<size_t> want, got;
      for (const MicroBatch& mb : whole.micro)
        for (const auto& seq : unpack(mb)) want.insert(identify(c, seq.first));
      int64_t loss_tokens = 0;
      for (int r = 0; r < 4; ++r) {
        const PackedStep s = ranks[static_cast<size_t>(r)].next();
        EXPECT_EQ(s.global_loss_tokens, whole.global_loss_tokens);
        EXPECT_EQ(s.global_tokens, whole.global_tokens);
        int64_t tokens = 0;
        for (const MicroBatch& mb : s.micro) {
          EXPECT_LE(mb.tokens(), 64);
          tokens += mb.tokens();
          for (const auto& seq : unpack(mb)) {
            const size_t d = identify(c, seq.first);
            EXPECT_EQ(seq, expected(c, d, 48)) << "document " << d;
            got.insert(d);
            loss_tokens += std::count_if(seq.second.begin(), seq.second.end(),
                                         [](int32_t t) { return t != -100; });
          }
          int64_t counted = 0;
          for (int64_t i = 0; i < mb.tokens(); ++i)
            counted += mb.targets.data<int32_t>()[i] != -100;
          EXPECT_EQ(counted, mb.loss_tokens);
        }
        EXPECT_EQ(tokens, s.rank_tokens[static_cast<size_t>(r)]);
      }
      EXPECT_EQ(got, want) << "step " << step << " balance " << balance_mode_name(balance);
      EXPECT_EQ(loss_tokens, whole.global_loss_tokens);
    }
  }
}

TEST(PackedLoader, BalancingEvensTheRanksCost) {
  const Corpus c = make_corpus("packed_balance", 400);
  // The spread (max − min) of the ranks' costs over 10 steps, each way measured in its unit:
  // tokens for none and tokens, FLOPs (a·s² + b·s) for flops.
  std::map<BalanceMode, double> spread;
  for (BalanceMode balance : {BalanceMode::kNone, BalanceMode::kTokens, BalanceMode::kFlops}) {
    PackedLoader l(std::vector<std::string>{c.path}, options(0, 4, balance));
    for (int step = 0; step < 10; ++step) {
      const PackedStep s = l.next();
      const auto [lo, hi] = std::minmax_element(s.rank_cost.begin(), s.rank_cost.end());
      // Karmarkar–Karp leaves a spread within the largest document's cost, here at most a
      // whole max_len document's.
      if (balance == BalanceMode::kTokens) {
        EXPECT_LE(*hi - *lo, 48.0);
      }
      if (balance == BalanceMode::kFlops) {
        EXPECT_LE(*hi - *lo, (SequenceCost{0.5, 10.0}(48)));
      }
      spread[balance] += *hi - *lo;
    }
  }
  EXPECT_LT(spread[BalanceMode::kTokens], 0.25 * spread[BalanceMode::kNone]);
}

TEST(PackedLoader, EqualMicroBatchesPadWithEmptyRows) {
  const Corpus c = make_corpus("packed_pad", 300);
  std::vector<int64_t> counts;
  for (int r = 0; r < 4; ++r) {
    PackingOptions o = options(r, 4, BalanceMode::kNone);
    o.equal_micro_batches = true;
    PackedLoader l(std::vector<std::string>{c.path}, o);
    const PackedStep s = l.next();
    counts.push_back(static_cast<int64_t>(s.micro.size()));
    EXPECT_EQ(static_cast<int64_t>(s.micro.size()),
              *std::max_element(s.rank_micro_batches.begin(), s.rank_micro_batches.end()));
    for (size_t m = static_cast<size_t>(s.rank_micro_batches[static_cast<size_t>(r)]);
         m < s.micro.size(); ++m) {
      EXPECT_EQ(s.micro[m].tokens(), 1);
      EXPECT_EQ(s.micro[m].loss_tokens, 0);
      EXPECT_EQ(s.micro[m].targets.data<int32_t>()[0], -100);
    }
  }
  EXPECT_EQ(std::set<int64_t>(counts.begin(), counts.end()).size(), 1u);
}

TEST(PackedLoader, ResumesWhereItWas) {
  const Corpus c = make_corpus("packed_resume", 300);
  PackedLoader a(std::vector<std::string>{c.path}, options(1, 2, BalanceMode::kFlops));
  for (int i = 0; i < 30; ++i) a.next();  // into a later epoch
  PackedLoader b(std::vector<std::string>{c.path}, options(1, 2, BalanceMode::kFlops));
  b.set_state(a.state());
  for (int i = 0; i < 5; ++i) {
    const PackedStep x = a.next(), y = b.next();
    ASSERT_EQ(x.micro.size(), y.micro.size());
    for (size_t m = 0; m < x.micro.size(); ++m) {
      EXPECT_EQ(x.micro[m].inputs.to_vector(), y.micro[m].inputs.to_vector());
      EXPECT_EQ(x.micro[m].targets.to_vector(), y.micro[m].targets.to_vector());
    }
  }
  EXPECT_THROW(b.set_state({0, 1000}), Error);
}

TEST(PackedLoader, ErrorsNameTheFileAndTheKey) {
  const Corpus c = make_corpus("packed_errors", 30);
  const std::string plain = fs::path(c.path).parent_path().string() + "/plain.bin";
  write_shard(plain, std::vector<int32_t>{1, 2, 3, 4});
  try {
    PackedLoader l(std::vector<std::string>{plain}, options(0, 1, BalanceMode::kNone));
    FAIL() << "a shard without a document index was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plain.docs"), std::string::npos) << e.what();
  }
  try {  // 27 usable documents, a step wants 6 × 8
    PackedLoader l(std::vector<std::string>{c.path}, options(0, 8, BalanceMode::kNone));
    FAIL() << "too few documents were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.batch_size"), std::string::npos) << e.what();
  }
  PackingOptions small = options(0, 1, BalanceMode::kNone);
  small.vocab_size = 120;  // the corpus uses ids up to 100 + 29
  EXPECT_THROW(PackedLoader(std::vector<std::string>{c.path}, small), Error);
  EXPECT_THROW(parse_balance_mode("lpt"), ConfigError);
}

}  // namespace
}  // namespace loom
