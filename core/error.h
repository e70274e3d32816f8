// core/error.h — Loom's one exception type and the check macros that raise it.
// Every failed check names the file:line of the call site. Bad user input is reported without
// it: ConfigError for a config key or command-line value, InputError for a damaged or
// mismatched file (checkpoint, data shard, model file), each naming the key or the file.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, const char* file, int line)
      : std::runtime_error(msg + " (" + location(file, line) + ")"), where_(location(file, line)) {}
  // The call site ("core/tensor.cpp:42").
  const std::string& where() const { return where_; }

 protected:
  struct NoLocation {};
  Error(const std::string& msg, const char* file, int line, NoLocation)
      : std::runtime_error(msg), where_(location(file, line)) {}

 private:
  static std::string location(const char* file, int line) {
    return std::string(file) + ":" + std::to_string(line);
  }
  std::string where_;
};

// Bad input in a file — a checkpoint, a data shard, a model file — that the user gave: the
// message names the file and what is wrong, and, as for ConfigError, carries no source location
// (the file is at fault, not the code); where() keeps it for a bug report. It is an Error, so
// code that handles damage (the resume fallback) catches both.
class InputError : public Error {
 public:
  InputError(const std::string& msg, const char* file, int line)
      : Error(msg, file, line, NoLocation{}) {}
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

// LOOM_INPUT_CHECK(cond, msg...) / LOOM_INPUT_FAIL(msg...): a file the user gave is damaged or
// does not fit (loom::InputError: the message must name the file).
#define LOOM_INPUT_CHECK(cond, ...)                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      throw ::loom::InputError(::loom::detail::str(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
#define LOOM_INPUT_FAIL(...) \
  throw ::loom::InputError(::loom::detail::str(__VA_ARGS__), __FILE__, __LINE__)
