// data/documents.cpp — writing and memory-mapping document shards (Note [Document index format]
// in data/documents.h). Every reader error names the file at fault and what is wrong with it.
#include "data/documents.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"

namespace loom {
namespace {

// Checks what write_document_shard is given (the caller's data, so loom::Error, not InputError).
void check_document_inputs(const std::string& path, std::span<const int32_t> tokens,
                           std::span<const uint8_t> mask, std::span<const int64_t> offsets) {
  const auto n = static_cast<int64_t>(tokens.size());
  LOOM_CHECK(mask.size() == tokens.size(), path, ": ", mask.size(), " loss-mask values for ", n,
             " tokens");
  LOOM_CHECK(!offsets.empty(), path, ": no document offsets (want documents + 1 values)");
  LOOM_CHECK(offsets.front() == 0 && offsets.back() == n, path,
             ": document offsets must run from 0 to the token count ", n, ", not from ",
             offsets.front(), " to ", offsets.back());
  LOOM_CHECK(offsets.size() - 1 <= static_cast<size_t>(INT32_MAX), path, ": ", offsets.size() - 1,
             " documents do not fit the header's int32 count");
  for (size_t d = 0; d + 1 < offsets.size(); ++d) {
    LOOM_CHECK(offsets[d] < offsets[d + 1], path, ": document ", d,
               " is empty or reversed (offsets ", offsets[d], " then ", offsets[d + 1], ")");
    LOOM_CHECK(mask[static_cast<size_t>(offsets[d])] == 0, path, ": document ", d,
               "'s first token has loss mask 1 (nothing before it to predict it from)");
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    LOOM_CHECK(mask[i] <= 1, path, ": loss-mask value ", int{mask[i]}, " at token ", i,
               " (must be 0 or 1)");
  }
}

void write_docs_file(const std::string& path, int64_t num_tokens, uint32_t checksum,
                     std::span<const uint8_t> mask, std::span<const int64_t> offsets) {
  std::vector<int32_t> header(kDocsHeaderInts, 0);
  header[0] = kDocsMagic;
  header[1] = kDocsVersion;
  header[2] = static_cast<int32_t>(offsets.size() - 1);
  header[3] = static_cast<int32_t>(num_tokens);
  std::memcpy(&header[4], &checksum, 4);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  LOOM_INPUT_CHECK(f != nullptr, path, ": cannot write document index: ", std::strerror(errno));
  bool ok = std::fwrite(header.data(), 4, header.size(), f) == header.size();
  ok = ok && std::fwrite(offsets.data(), 8, offsets.size(), f) == offsets.size();
  ok = ok && (mask.empty() || std::fwrite(mask.data(), 1, mask.size(), f) == mask.size());
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    LOOM_INPUT_FAIL(path, ": cannot write document index: ", std::strerror(err));
  }
}

// Checks the .docs header (the first 5 int32s) against its .bin and the file size; returns
// the number of documents. `p` is the .docs path, for errors.
int64_t check_docs_header(const std::string& p, const int32_t (&header)[5], int64_t file_bytes,
                          const ShardReader& shard) {
  LOOM_INPUT_CHECK(header[0] == kDocsMagic, p, ": bad magic ", header[0], " (expected ", kDocsMagic,
                   "): not a document index");
  LOOM_INPUT_CHECK(header[1] != 1, p,
                   ": document index version 1 has no checksum of its .bin (version ", kDocsVersion,
                   " has): re-run prepare_data --format chat to rewrite the shards");
  LOOM_INPUT_CHECK(header[1] == kDocsVersion, p, ": unsupported document index version ", header[1],
                   " (expected ", kDocsVersion, ")");
  LOOM_INPUT_CHECK(header[2] >= 0 && header[3] >= 0, p, ": negative count in header (", header[2],
                   " documents, ", header[3], " tokens)");
  const int64_t docs = header[2], n = header[3];
  LOOM_INPUT_CHECK(n == shard.num_tokens(), p, ": header says ", n, " tokens but ", shard.path(),
                   " holds ", shard.num_tokens(), " (the .docs belongs to another shard?)");
  const int64_t want = kDocsHeaderBytes + 8 * (docs + 1) + n;
  LOOM_INPUT_CHECK(file_bytes >= want, p, ": truncated: header says ", docs, " documents and ", n,
                   " tokens (", want, " bytes) but file has ", file_bytes, " bytes");
  LOOM_INPUT_CHECK(file_bytes == want, p, ": ", file_bytes - want, " trailing bytes: header says ",
                   docs, " documents and ", n, " tokens (", want, " bytes) but file has ",
                   file_bytes, " bytes");
  uint32_t stored = 0;
  std::memcpy(&stored, &header[4], 4);
  const uint32_t actual = shard_token_checksum(shard.tokens());
  if (stored != actual) {
    char hex[64];
    std::snprintf(hex, sizeof(hex), "%08x but its tokens give %08x", stored, actual);
    LOOM_INPUT_FAIL(p, ": written for another shard: it records the checksum of ", shard.path(),
                    " as ", hex,
                    " (the .docs belongs to another shard, or the .bin was rewritten)");
  }
  return docs;
}

}  // namespace

uint32_t shard_token_checksum(TokenSpan tokens) {
  const int64_t kBlockTokens = (int64_t{1} << 20) / tokens.width();  // 1 MiB of tokens
  const auto n = tokens.size();
  const int64_t blocks = (n + kBlockTokens - 1) / kBlockTokens;
  std::vector<uint32_t> crcs(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlockTokens, len = std::min(kBlockTokens, n - begin);
    crcs[static_cast<size_t>(b)] =
        crc32c(static_cast<const char*>(tokens.data()) + begin * tokens.width(),
               static_cast<size_t>(len * tokens.width()));
  }
  return crc32c(crcs.data(), crcs.size() * 4);  // the host is little-endian (as the files are)
}

std::string docs_path_for(const std::string& shard_path) {
  constexpr std::string_view kBin = ".bin";
  if (shard_path.ends_with(kBin)) {
    return shard_path.substr(0, shard_path.size() - kBin.size()) + ".docs";
  }
  return shard_path + ".docs";
}

bool has_document_index(const std::string& shard_path) {
  std::error_code ec;
  return std::filesystem::exists(docs_path_for(shard_path), ec);
}

void write_document_shard(const std::string& shard_path, std::span<const int32_t> tokens,
                          std::span<const uint8_t> loss_mask, std::span<const int64_t> doc_offsets,
                          int width) {
  check_document_inputs(shard_path, tokens, loss_mask, doc_offsets);
  write_shard(shard_path, tokens, width);  // checks the count and that every token fits
  // The checksum of the bytes as written (read back through the mapping).
  const uint32_t checksum = shard_token_checksum(ShardReader(shard_path).tokens());
  write_docs_file(docs_path_for(shard_path), static_cast<int64_t>(tokens.size()), checksum,
                  loss_mask, doc_offsets);
}

DocumentReader::DocumentReader(const std::string& shard_path)
    : shard_(shard_path), docs_path_(docs_path_for(shard_path)) {
  const std::string& p = docs_path_;
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    LOOM_INPUT_FAIL(p, ": cannot open the document index of ", shard_path, ": ", std::strerror(err),
                    err == ENOENT ? " (a plain token shard has none; prepare_data --format chat "
                                    "writes document shards)"
                                  : "");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    LOOM_INPUT_FAIL(p, ": cannot stat document index: ", std::strerror(err));
  }
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kDocsHeaderBytes) {
    ::close(fd);
    LOOM_INPUT_FAIL(p, ": too small for a document index header: file has ", file_bytes,
                    " bytes, the header alone is ", kDocsHeaderBytes);
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  LOOM_INPUT_CHECK(map_ != MAP_FAILED, p, ": cannot mmap document index: ", std::strerror(err));
  map_bytes_ = static_cast<size_t>(file_bytes);
  try {
    int32_t header[5];
    std::memcpy(header, map_, sizeof(header));
    const int64_t docs = check_docs_header(p, header, file_bytes, shard_);
    std::memcpy(&token_checksum_, &header[4], 4);
    const int64_t n = shard_.num_tokens();
    const char* base = static_cast<const char*>(map_);
    offsets_ = reinterpret_cast<const int64_t*>(base + kDocsHeaderBytes);
    mask_ = reinterpret_cast<const uint8_t*>(base + kDocsHeaderBytes + 8 * (docs + 1));
    LOOM_INPUT_CHECK(offsets_[0] == 0, p, ": offsets[0] is ", offsets_[0], " (must be 0)");
    for (int64_t d = 0; d < docs; ++d) {
      LOOM_INPUT_CHECK(offsets_[d] < offsets_[d + 1] && offsets_[d + 1] <= n, p,
                       ": offsets not increasing or out of range: document ", d, " spans [",
                       offsets_[d], ", ", offsets_[d + 1], ") of ", n, " tokens");
      LOOM_INPUT_CHECK(mask_[offsets_[d]] == 0, p, ": document ", d, " (offset ", offsets_[d],
                       ") has loss mask 1 on its first token (must be 0: nothing precedes it)");
    }
    LOOM_INPUT_CHECK(offsets_[docs] == n, p, ": offsets[", docs, "] is ", offsets_[docs],
                     " (must be the token count ", n, ")");
    int64_t loss = 0, bad = 0;
#pragma omp parallel for reduction(+ : loss, bad) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      loss += mask_[i] == 1;
      bad += mask_[i] > 1;
    }
    if (bad > 0) {
      const int64_t at = std::find_if(mask_, mask_ + n, [](uint8_t m) { return m > 1; }) - mask_;
      LOOM_INPUT_FAIL(p, ": loss-mask value ", int{mask_[at]}, " at token offset ", at, " (", bad,
                      " such values; each must be 0 or 1)");
    }
    num_docs_ = docs;
    num_loss_tokens_ = loss;
  } catch (...) {
    unmap();
    throw;
  }
}

void DocumentReader::check_vocab(int64_t vocab_size) const {
  const int64_t at = first_token_at_or_above(shard_.tokens(), vocab_size);
  if (at < 0) return;
  const TokenSpan t = shard_.tokens();
  const int64_t d = std::upper_bound(offsets_, offsets_ + num_docs_ + 1, at) - offsets_ - 1;
  LOOM_INPUT_FAIL(path(), ": token ", t[at], " at offset ", at, " (document ", d, ", position ",
                  at - offsets_[d], " of its ", doc_length(d),
                  " tokens) is outside model.vocab_size ", vocab_size,
                  " (the shard was written for another vocabulary?)");
}

void DocumentReader::unmap() {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  offsets_ = nullptr;
  mask_ = nullptr;
  num_docs_ = 0;
  num_loss_tokens_ = 0;
}

DocumentReader::~DocumentReader() { unmap(); }

DocumentReader::DocumentReader(DocumentReader&& other) noexcept
    : shard_(std::move(other.shard_)),
      docs_path_(std::move(other.docs_path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      offsets_(std::exchange(other.offsets_, nullptr)),
      mask_(std::exchange(other.mask_, nullptr)),
      num_docs_(std::exchange(other.num_docs_, 0)),
      num_loss_tokens_(std::exchange(other.num_loss_tokens_, 0)),
      token_checksum_(std::exchange(other.token_checksum_, 0u)) {}

DocumentReader& DocumentReader::operator=(DocumentReader&& other) noexcept {
  if (this != &other) {
    unmap();
    shard_ = std::move(other.shard_);
    docs_path_ = std::move(other.docs_path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    offsets_ = std::exchange(other.offsets_, nullptr);
    mask_ = std::exchange(other.mask_, nullptr);
    num_docs_ = std::exchange(other.num_docs_, 0);
    num_loss_tokens_ = std::exchange(other.num_loss_tokens_, 0);
    token_checksum_ = std::exchange(other.token_checksum_, 0u);
  }
  return *this;
}

}  // namespace loom
