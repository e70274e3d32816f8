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
  } catch (const json::exception& e) {
    LOOM_INPUT_FAIL(path, ": corrupt header: ", e.what());
  }
  LOOM_INPUT_CHECK(header.is_object(), path, ": corrupt header: not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  SafetensorsIndex index;
  index.path = path;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          index.metadata[m.key()] = m.value().get<std::string>();
        continue;
      }
      const json& e = it.value();
      SafetensorsEntry entry;
      entry.name = it.key();
      LOOM_INPUT_CHECK(parse_dtype(e.at("dtype").get<std::string>(), &entry.dtype), path,
                       ": tensor '", entry.name, "' has unknown dtype ", e.at("dtype").dump());
      entry.shape = e.at("shape").get<Shape>();
      // The element count and byte size, refusing negative sizes and int64 overflow.
      uint64_t bytes = dtype_size(entry.dtype);
      for (int64_t d : entry.shape) {
        LOOM_INPUT_CHECK(
            d >= 0 && !__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) &&
                bytes <= (uint64_t{1} << 62),
            path, ": tensor '", entry.name, "' has an impossible shape ", shape_str(entry.shape));
      }
      const uint64_t begin = e.at("data_offsets").at(0).get<uint64_t>();
      const uint64_t end = e.at("data_offsets").at(1).get<uint64_t>();
      LOOM_INPUT_CHECK(end >= begin && end - begin == bytes, path, ": tensor '", entry.name,
                       "' has ", end - begin, " bytes for shape ", shape_str(entry.shape), " ",
                       dtype_name(entry.dtype));
      LOOM_INPUT_CHECK(end <= data_size, path, ": truncated: tensor '", entry.name,
                       "' ends at byte ", data_start + end, " but the file has ", file_size);
      entry.begin = data_start + begin;
      entry.end = data_start + end;
      index.entries.push_back(std::move(entry));
    }
  } catch (const json::exception& e) {
    LOOM_INPUT_FAIL(path, ": corrupt header: ", e.what());
  }
  std::sort(index.entries.begin(), index.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
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
