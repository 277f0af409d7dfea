// A test program's environment variables, read one way: unset and empty are the same (the
// fallback), and a value that is not what it should be is an error that names the variable.
// Header-only, so that the worker programs the tests start can include it without linking
// lspawn_test_support (their include path only). Tests only.
#pragma once

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace lspawn::test {

// $name, or `fallback` when it is unset or empty.
inline std::string env_str(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// $name as a whole int (base 10), or `fallback` when it is unset or empty. Throws
// std::runtime_error "NAME='x' is not an integer" for anything else.
inline int env_int(const char* name, int fallback = -1) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < INT_MIN || n > INT_MAX)
    throw std::runtime_error(std::string(name) + "='" + v + "' is not an integer");
  return static_cast<int>(n);
}

}  // namespace lspawn::test
