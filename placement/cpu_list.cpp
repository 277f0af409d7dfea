#include "placement/cpu_list.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace lspawn::placement {

namespace {
constexpr int kMaxCpu = CPU_SETSIZE - 1;  // what a cpu_set_t holds (1024 CPUs)

int parse_number(const std::string& s, const std::string& what, const std::string& text) {
  if (s.empty() || s.size() > 5 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    throw std::invalid_argument(what + ": '" + text + "' is not a CPU list (such as 0-3,8)");
  }
  const int n = std::atoi(s.c_str());
  if (n > kMaxCpu)
    throw std::invalid_argument(what + ": CPU " + s + " is beyond the " + std::to_string(kMaxCpu + 1) +
                                " lspawn handles");
  return n;
}
}  // namespace

CpuList parse_cpu_list(const std::string& text, const std::string& what) {
  std::string t;
  for (char c : text) {
    if (c != ' ' && c != '\n' && c != '\t') t += c;
  }
  CpuList out;
  size_t pos = 0;
  while (pos < t.size()) {
    size_t comma = t.find(',', pos);
    if (comma == std::string::npos) comma = t.size();
    const std::string item = t.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(parse_number(item, what, text));
    } else {
      const int lo = parse_number(item.substr(0, dash), what, text);
      const int hi = parse_number(item.substr(dash + 1), what, text);
      if (hi < lo)
        throw std::invalid_argument(what + ": '" + text + "' has the range " + item + ", which ends before it starts");
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    }
    pos = comma + 1;
    if (comma + 1 == t.size()) throw std::invalid_argument(what + ": '" + text + "' is not a CPU list (such as 0-3,8)");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string cpu_list_text(const CpuList& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

CpuList current_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CpuList out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c <= kMaxCpu; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

int usable_cpu_count() { return std::max(1, static_cast<int>(current_affinity().size())); }

int set_affinity(const CpuList& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c >= 0 && c <= kMaxCpu) CPU_SET(c, &set);
  }
  return ::sched_setaffinity(0, sizeof set, &set) == 0 ? 0 : errno;
}

CpuList intersect(const CpuList& a, const CpuList& b) {
  CpuList out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

}  // namespace lspawn::placement
