// core/crc32c.h — CRC-32C (Castagnoli), the checksum of TensorBoard's record framing, of
// every tensor in a Loom checkpoint and of a document shard's tokens (data/documents.h).
// Table-driven; the table is built at compile time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace loom {

namespace detail {
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
inline constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();
}  // namespace detail

// Continues a CRC over more bytes: crc32c(b, crc32c(a)) == crc32c(a ++ b).
inline uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = detail::kCrc32cTable[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

}  // namespace loom
