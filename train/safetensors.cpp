// train/safetensors.cpp — safetensors I/O with full validation (see train/safetensors.h).
#include "train/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom {
namespace {

using nlohmann::json;

const char* st_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU16:
      return "U16";
    case DType::kU32:
      return "U32";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kU16, DType::kU32}) {
    if (s == st_dtype(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

}  // namespace

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  LOOM_CHECK(fd >= 0, path, ": cannot open to sync");
  const int rc = ::fsync(fd);
  ::close(fd);
  LOOM_CHECK(rc == 0, path, ": fsync failed");
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(name != "__metadata__" && !header.contains(name), path,
               ": duplicate or reserved tensor name '", name, "'");
    Tensor h = t.detach().to(Device::cpu()).contiguous();
    header[name] = {{"dtype", st_dtype(h.dtype())},
                    {"shape", h.shape()},
                    {"data_offsets", {offset, offset + h.nbytes()}}};
    offset += h.nbytes();
    host.push_back(h);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(out, tmp, ": cannot open for writing");
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Tensor& h : host)
      out.write(static_cast<const char*>(h.raw_data()), static_cast<std::streamsize>(h.nbytes()));
    out.flush();
    LOOM_CHECK(out, tmp, ": write failed (disk full?)");
  }
  fsync_path(tmp);
  LOOM_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot rename ", tmp,
             " into place");
}

namespace {

// One tensor's header entry {dtype, shape, data_offsets} into `entry` (offsets relative to the
// data), every field checked with the file and the tensor named (never the JSON library's text).
void parse_entry(const std::string& path, const json& e, SafetensorsEntry& entry) {
  const std::string what = path + ": corrupt header: tensor '" + entry.name + "'";
  LOOM_INPUT_CHECK(e.is_object(), what, " is not an object");
  LOOM_INPUT_CHECK(e.contains("dtype") && e["dtype"].is_string(), what,
                   ": 'dtype' is missing or not a string");
  LOOM_INPUT_CHECK(parse_dtype(e["dtype"].get<std::string>(), &entry.dtype), path, ": tensor '",
                   entry.name, "' has unknown dtype ", e["dtype"].dump());
  LOOM_INPUT_CHECK(e.contains("shape") && e["shape"].is_array(), what,
                   ": 'shape' is missing or not a list");
  // The element count and byte size, refusing negative sizes and int64 overflow.
  uint64_t bytes = dtype_size(entry.dtype);
  for (const json& d : e["shape"]) {
    LOOM_INPUT_CHECK(d.is_number_unsigned(), what, ": 'shape' ", e["shape"].dump(),
                     " is not a list of non-negative integers");
    const uint64_t n = d.get<uint64_t>();
    LOOM_INPUT_CHECK(!__builtin_mul_overflow(bytes, n, &bytes) && bytes <= (uint64_t{1} << 62),
                     path, ": tensor '", entry.name, "' has an impossible shape ",
                     e["shape"].dump());
    entry.shape.push_back(static_cast<int64_t>(n));
  }
  const json& offsets = e.contains("data_offsets") ? e["data_offsets"] : json();
  LOOM_INPUT_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                       offsets[1].is_number_unsigned(),
                   what, ": 'data_offsets' is not a pair of non-negative integers");
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  LOOM_INPUT_CHECK(entry.end >= entry.begin && entry.end - entry.begin == bytes, path, ": tensor '",
                   entry.name, "' has ", entry.end - entry.begin, " bytes for shape ",
                   shape_str(entry.shape), " ", dtype_name(entry.dtype));
}

// The data section holds the tensors back to back, each byte in exactly one tensor: no overlap,
// no gap, nothing after the last (what the format and its reference library require).
void check_data_layout(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       uint64_t data_size, uint64_t data_start) {
  uint64_t at = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
    LOOM_INPUT_CHECK(e.begin >= at, path, ": tensors '", prev ? prev->name : "", "' and '", e.name,
                     "' overlap (bytes [", data_start + e.begin, ", ",
                     data_start + std::min(at, e.end), "))");
    LOOM_INPUT_CHECK(e.begin == at, path, ": ", e.begin - at, " unused bytes before tensor '",
                     e.name, "' (at byte ", data_start + at, ")");
    LOOM_INPUT_CHECK(e.end <= data_size, path, ": truncated: tensor '", e.name, "' ends at byte ",
                     data_start + e.end, " but the file has ", data_start + data_size);
    at = e.end;
    prev = &e;
  }
  LOOM_INPUT_CHECK(at == data_size, path, ": ", data_size - at, " bytes after the last tensor",
                   prev ? " '" + prev->name + "'" : std::string(), " (the file has ",
                   data_start + data_size, " bytes, its tensors end at byte ", data_start + at,
                   ")");
}

}  // namespace

SafetensorsIndex read_safetensors_index(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  LOOM_INPUT_CHECK(in, path, ": cannot open");
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  LOOM_INPUT_CHECK(file_size >= 8, path, ": truncated: ", file_size,
                   " bytes, smaller than the 8-byte header length");
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  LOOM_INPUT_CHECK(header_len <= file_size - 8, path, ": truncated or corrupt: header length ",
                   header_len, " exceeds the file (", file_size, " bytes)");
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  LOOM_INPUT_CHECK(in, path, ": read failed in the header");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& e) {
    LOOM_INPUT_FAIL(path, ": corrupt header: not valid JSON (at byte ", 8 + e.byte, ")");
  } catch (const json::exception&) {
    LOOM_INPUT_FAIL(path, ": corrupt header: not valid JSON");
  }
  LOOM_INPUT_CHECK(header.is_object(), path, ": corrupt header: not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  SafetensorsIndex index;
  index.path = path;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      LOOM_INPUT_CHECK(it.value().is_object(), path,
                       ": corrupt header: '__metadata__' is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        LOOM_INPUT_CHECK(m.value().is_string(), path, ": corrupt header: metadata '", m.key(),
                         "' is not a string");
        index.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry;
    entry.name = it.key();
    parse_entry(path, it.value(), entry);
    index.entries.push_back(std::move(entry));
  }
  std::sort(index.entries.begin(), index.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  check_data_layout(path, index.entries, data_size, data_start);
  for (SafetensorsEntry& e : index.entries) {
    e.begin += data_start;
    e.end += data_start;
  }
  return index;
}

void read_file_bytes(const std::string& path, uint64_t offset, uint64_t n, void* dst) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  LOOM_INPUT_CHECK(fd >= 0, path, ": cannot open");
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got <= 0) {
      ::close(fd);
      LOOM_INPUT_FAIL(path, ": truncated: cannot read bytes [", offset + done, ", ", offset + n,
                      ")");
    }
    done += static_cast<uint64_t>(got);
  }
  ::close(fd);
}

SafetensorsFile read_safetensors(const std::string& path) {
  const SafetensorsIndex index = read_safetensors_index(path);
  SafetensorsFile f;
  f.metadata = index.metadata;
  for (const SafetensorsEntry& e : index.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_file_bytes(path, e.begin, e.end - e.begin, t.raw_data());
    f.tensors.emplace_back(e.name, t);
  }
  return f;
}

}  // namespace loom
