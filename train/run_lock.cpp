// train/run_lock.cpp — see train/run_lock.h.
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace loom {

RunLock::RunLock(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK(fd_ >= 0, path, ": cannot open: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char buf[256] = {0};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    std::string who = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "an unknown process";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    throw ConfigError("train.out_dir: " + dir + " is in use by another run (" + who +
                      "); give this run its own out_dir, or stop the other one");
  }
  char host[128] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The lock holds without the note; the other run's message is then less specific.
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace loom
