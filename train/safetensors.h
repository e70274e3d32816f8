// train/safetensors.h — reading and writing the safetensors file format (8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {…}}, then
// raw little-endian tensor bytes). Loom's native checkpoints use it for their tensor shards, and
// the Hugging Face converters read and write it. Reading validates every size and offset and
// names the file and tensor on any inconsistency (truncated files included).
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

// fsync of a file or directory by path; errors name the path.
void fsync_path(const std::string& path);

}  // namespace loom
