// core/read_file.h — reading a whole file that the user named (a data file, a config, a
// template) into memory, with failure reported as one line in Loom's words ("Is a directory",
// "No such file or directory"), never as a stream library's exception. It throws nothing: the
// caller names the file and picks the error type (InputError for data, ConfigError for a config).
#pragma once

#include <string>

namespace loom {

// Reads the file at `path` into `out`. Returns "" on success, else why it could not be read (the
// system's reason, without the path), and `out` is then unspecified.
std::string read_whole_file(const std::string& path, std::string& out);

}  // namespace loom
