#include "support/files.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <sys/stat.h>
#include <unistd.h>

namespace lspawn::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  const auto fail = [&](const std::string& call) {
    throw std::runtime_error("write_file " + path + ": " + call + ": " + std::strerror(errno));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wbe");
  if (f == nullptr) fail("fopen " + tmp);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written) fail("write " + tmp);
  if (::chmod(tmp.c_str(), mode) != 0) fail("chmod " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename " + tmp);
}

void touch(const std::string& path) { std::ofstream(path) << "\n"; }

bool path_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace lspawn::test
