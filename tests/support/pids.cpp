#include "support/pids.hpp"

#include <cerrno>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <thread>

#include <sys/prctl.h>
#include <sys/wait.h>

namespace lspawn::test {

bool alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(f, s)) return false;
  const auto close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return false;
  const char state = s[close + 2];
  return state != 'Z' && state != 'X';
}

Subreaper::Subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw std::system_error(errno, std::generic_category(), "prctl(PR_SET_CHILD_SUBREAPER)");
  }
}

Subreaper::~Subreaper() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {}
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

std::set<pid_t> alive_after(const std::set<pid_t>& pids, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  std::set<pid_t> left = pids;
  for (;;) {
    for (pid_t p : pids) ::waitpid(p, nullptr, WNOHANG);
    for (auto it = left.begin(); it != left.end();) it = alive(*it) ? std::next(it) : left.erase(it);
    if (left.empty() || std::chrono::steady_clock::now() >= end) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace lspawn::test
