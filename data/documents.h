// data/documents.h — document shards for post-training (SFT) data: an ordinary llm.c token shard
// X.bin (data/shard.h, unchanged, so every tool that reads shards still reads it) plus a sidecar
// X.docs that keeps the document boundaries and a per-token loss mask. write_document_shard
// writes the pair; DocumentReader maps both read-only and validates them, naming the file and
// the problem. Nothing here tokenizes, packs or batches (data/prepare.h writes these shards; the
// packed loader reads them).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "data/shard.h"

namespace loom {

// Note [Document index format]
// X.docs, all little-endian:
//   header   int32[256]: [0] magic kDocsMagic, [1] version kDocsVersion, [2] number of
//            documents D, [3] number of tokens N (equal to X.bin's count), [4] X.bin's token
//            checksum (uint32 bits, shard_token_checksum), the rest 0;
//   offsets  int64[D + 1]: offsets[0] = 0, strictly increasing, offsets[D] = N; document d is
//            the tokens [offsets[d], offsets[d+1]) of X.bin (so no document is empty, and a
//            document never crosses a shard);
//   mask     uint8[N]: 1 iff the token is a training target — the model is trained to predict
//            it from the tokens before it *in its document* — else 0. The first token of every
//            document has nothing before it, so its mask is 0.
// The file is exactly 1024 + 8(D + 1) + N bytes. In training terms: a row built from document d
// has inputs tokens[b, e-1) and targets tokens[b+1, e); target i counts in the loss iff
// mask[b + 1 + i] == 1. The header leaves room for later fields; a new layout gets a new version.
// The checksum ties the sidecar to its own .bin: another shard's .docs with the same token count
// (a copied or mixed-up file) fits every other check and would silently pair the wrong documents
// and loss mask with the tokens; the reader refuses it, naming both files. Version 1 (no
// checksum, before issue 28) is refused with a message saying to re-run prepare_data.
inline constexpr int32_t kDocsMagic = 20241205;
inline constexpr int32_t kDocsVersion = 2;
inline constexpr int64_t kDocsHeaderInts = 256;
inline constexpr int64_t kDocsHeaderBytes = kDocsHeaderInts * 4;

// The checksum of a shard's token bytes stored in its .docs header: CRC-32C (core/crc32c.h) of
// each 1 MiB block of the tokens' little-endian bytes (the last block shorter), then CRC-32C of
// those block checksums as little-endian uint32s; 0 for no tokens. The table-driven CRC is not
// hardware-accelerated (about 2.5 s per GB on one core), so the blocks are checksummed in
// parallel (OpenMP): every byte is covered at open, at a fraction of a second per shard.
uint32_t shard_token_checksum(TokenSpan tokens);

// The sidecar of a shard: "dir/train_000000.bin" -> "dir/train_000000.docs" (a path that does
// not end in ".bin" gets ".docs" appended).
std::string docs_path_for(const std::string& shard_path);
// Whether the shard's sidecar exists (a plain shard has none).
bool has_document_index(const std::string& shard_path);

// Writes X.bin (write_shard) and X.docs, each via a .tmp file and a rename, the .docs last (so a
// .docs never describes a .bin that is still being written). Checks its inputs (loom::Error):
// one mask value per token, each 0 or 1, offsets as in Note [Document index format], every
// document's first mask 0, tokens that fit `width` bytes (2 or 4, write_shard). A file that
// cannot be written is a loom::InputError naming it.
void write_document_shard(const std::string& shard_path, std::span<const int32_t> tokens,
                          std::span<const uint8_t> loss_mask, std::span<const int64_t> doc_offsets,
                          int width = 2);

// A document shard mapped read-only. The constructor validates the whole pair (the .bin as
// ShardReader does; the .docs's size, header, the .bin's checksum, offsets and every mask value)
// and throws loom::InputError naming the file and the problem. Movable, not copyable.
class DocumentReader {
 public:
  explicit DocumentReader(const std::string& shard_path);
  ~DocumentReader();
  DocumentReader(DocumentReader&& other) noexcept;
  DocumentReader& operator=(DocumentReader&& other) noexcept;
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  const std::string& path() const { return shard_.path(); }  // the .bin path
  const std::string& docs_path() const { return docs_path_; }
  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return shard_.num_tokens(); }
  int64_t doc_begin(int64_t d) const { return offsets_[d]; }  // token offset in the shard
  int64_t doc_length(int64_t d) const { return offsets_[d + 1] - offsets_[d]; }
  TokenSpan doc_tokens(int64_t d) const {
    return shard_.tokens().subspan(offsets_[d], doc_length(d));
  }
  std::span<const uint8_t> doc_mask(int64_t d) const {
    return {mask_ + offsets_[d], static_cast<size_t>(doc_length(d))};
  }
  // The whole shard: offsets (num_docs() + 1 values), tokens and mask (num_tokens() each).
  std::span<const int64_t> offsets() const {
    return {offsets_, static_cast<size_t>(num_docs_ + 1)};
  }
  TokenSpan tokens() const { return shard_.tokens(); }
  std::span<const uint8_t> loss_mask() const { return {mask_, static_cast<size_t>(num_tokens())}; }
  // Tokens with mask 1 in the shard (counted once, when it is opened).
  int64_t num_loss_tokens() const { return num_loss_tokens_; }
  // The checksum of the .bin's tokens the .docs records (verified when opened).
  uint32_t token_checksum() const { return token_checksum_; }

  // Every token < vocab_size, else an InputError naming the shard, the document, and the offset
  // (in the shard and in the document) of the first token outside it.
  void check_vocab(int64_t vocab_size) const;

 private:
  void unmap();

  ShardReader shard_;
  std::string docs_path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const int64_t* offsets_ = nullptr;
  const uint8_t* mask_ = nullptr;
  int64_t num_docs_ = 0;
  int64_t num_loss_tokens_ = 0;
  uint32_t token_checksum_ = 0;
};

}  // namespace loom
