#include "sys/duration_text.hpp"

#include <algorithm>
#include <cstdio>

namespace lspawn {

std::string seconds_number(std::chrono::duration<double> d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", d.count());
  std::string s = buf;
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string seconds_text(std::chrono::duration<double> d) { return seconds_number(d) + " s"; }

std::string elapsed_text(std::chrono::duration<double> d) {
  const double s = std::max(d.count(), 0.0);
  char buf[48];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.2g s" : s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

}  // namespace lspawn
