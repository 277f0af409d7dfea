#include "sys/shm_segments.hpp"

#include <dirent.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <sstream>
#include <vector>

namespace lspawn::sys {
namespace {

constexpr const char* kPrefix = "lspawn-";

// "<anything>-<pid>-<hex>" after the prefix: the pid is the second field from the end.
bool created_by(const char* name, pid_t pid) {
  if (std::strncmp(name, kPrefix, std::strlen(kPrefix)) != 0) return false;
  const std::string s(name + std::strlen(kPrefix));
  const size_t last = s.rfind('-');
  if (last == std::string::npos || last == 0 || last + 1 == s.size()) return false;
  for (size_t i = last + 1; i < s.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  const size_t before = s.rfind('-', last - 1);
  if (before == std::string::npos) return false;
  return s.compare(before + 1, last - before - 1, std::to_string(pid)) == 0;
}

}  // namespace

std::string shm_segment_name(const std::string& label, pid_t pid, uint64_t nonce) {
  std::string clean;
  for (char c : label.substr(0, 64)) clean += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  std::ostringstream n;
  n << "/" << kPrefix << clean << "-" << pid << "-" << std::hex << nonce;
  return n.str();
}

int remove_shm_segments_of(pid_t pid, const std::string& dir) {
  if (pid <= 0) return 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  std::vector<std::string> found;
  while (const dirent* e = ::readdir(d)) {
    if (created_by(e->d_name, pid)) found.emplace_back(e->d_name);
  }
  ::closedir(d);
  int removed = 0;
  for (const auto& name : found) removed += ::unlink((dir + "/" + name).c_str()) == 0;
  return removed;
}

}  // namespace lspawn::sys
