// core/read_file.cpp — read_whole_file through stdio, so a directory, a device or a read error
// is a returned reason (strerror), not std::ios_base::failure's library text.
#include "core/read_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace loom {

std::string read_whole_file(const std::string& path, std::string& out) {
  out.clear();
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::strerror(errno);
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (failed) return std::strerror(err != 0 ? err : EIO);
  return "";
}

}  // namespace loom
