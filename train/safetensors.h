// train/safetensors.h — reading and writing the safetensors file format (8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {…}}, then
// raw little-endian tensor bytes). Loom's native checkpoints use it for their tensor shards, and
// the Hugging Face converters read and write it. Reading validates every size and offset and
// names the file and tensor on any inconsistency (truncated files included; tensors that
// overlap, leave a gap, or bytes after the last one, which the format and its reference library
// refuse too), in Loom's words (never the JSON library's).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order, CPU, contiguous
  std::map<std::string, std::string> metadata;
};

// Writes `path` (through a .tmp file, fsync'ed, then renamed, so a crash leaves either the old
// file or the new one). Tensors may live on any device and in any layout.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
SafetensorsFile read_safetensors(const std::string& path);

// A file's header alone: each tensor's dtype, shape and where its bytes are in the file (begin,
// end: absolute offsets), validated as read_safetensors validates them, so a caller can read
// only the byte ranges it needs (read_file_bytes).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};
struct SafetensorsIndex {
  std::string path;
  std::vector<SafetensorsEntry> entries;  // in data order
  std::map<std::string, std::string> metadata;
};
SafetensorsIndex read_safetensors_index(const std::string& path);
// Reads bytes [offset, offset + n) of `path` into dst; a short file is an error naming it.
void read_file_bytes(const std::string& path, uint64_t offset, uint64_t n, void* dst);

// fsync of a file or directory by path; errors name the path.
void fsync_path(const std::string& path);

}  // namespace loom
