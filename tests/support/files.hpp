// Whole-file reads and writes for tests: what a test gives a program and reads back from it.
// Tests only.
#pragma once

#include <string>

#include <sys/types.h>

namespace lspawn::test {

// The whole content of the file at `path` ("" when it cannot be read).
std::string read_file(const std::string& path);

// Writes `text` to `path` with permissions `mode`, atomically: into `path`.tmp, then renamed, so
// that a reader polling for `path` never sees it half written. Throws std::runtime_error naming
// the path and the failed call.
void write_file(const std::string& path, const std::string& text, mode_t mode = 0644);

// Creates (or truncates) `path` with one "\n"; never throws (a worker's sync file, written
// from a destructor too): the other side waits for it with wait_file().
void touch(const std::string& path);

// Whether anything (a file, a directory, a link to something) is at `path`.
bool path_exists(const std::string& path);

}  // namespace lspawn::test
