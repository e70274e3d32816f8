// core/error.h — Loom's one exception type and the check macros that raise it.
// Every failed check names the file:line of the call site. Bad user input (config, data,
// checkpoints) is reported through the same type with a message naming the file and field.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, const char* file, int line)
      : std::runtime_error(msg + " (" + file + ":" + std::to_string(line) + ")") {}
};

// Bad user input (a config key, a command-line value): the message names the key and says
// why, and carries no source location (the user's input is at fault, not the code).
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
// Streams any number of arguments into one string: detail::str("x=", x, " y=", y).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace loom

// LOOM_CHECK(cond, msg...): throws loom::Error with the message and the call site when cond fails.
#define LOOM_CHECK(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) {                                                               \
      throw ::loom::Error(::loom::detail::str(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

// LOOM_CONFIG_CHECK(cond, msg...): throws loom::ConfigError with the message when cond fails.
#define LOOM_CONFIG_CHECK(cond, ...)                                          \
  do {                                                                        \
    if (!(cond)) throw ::loom::ConfigError(::loom::detail::str(__VA_ARGS__)); \
  } while (0)

#define LOOM_FAIL(...) throw ::loom::Error(::loom::detail::str(__VA_ARGS__), __FILE__, __LINE__)
