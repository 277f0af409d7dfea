#include "launchenv/slurm_tasks_per_node.hpp"

#include <cstdint>

namespace lspawn::slurm {

std::vector<int> expand_tasks_per_node(std::string_view text, const std::string& variable) {
  const auto fail = [&](const std::string& problem) -> void {
    throw EnvSyntaxError(variable, std::string(text), problem);
  };
  const std::string form = " (expected counts such as 2(x3),1)";
  if (text.empty()) fail("empty" + form);
  // Reads digits at i into v (at most 9); false when there are none.
  auto number = [&](size_t& i, uint64_t& v) {
    const size_t b = i;
    v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (i - b >= 9) fail("number at offset " + std::to_string(b) + " has more than 9 digits");
      v = v * 10 + static_cast<uint64_t>(text[i] - '0');
      ++i;
    }
    return i > b;
  };
  std::vector<int> out;
  size_t i = 0;
  for (;;) {
    uint64_t count = 0;
    uint64_t repeat = 1;
    const size_t at = i;
    if (!number(i, count)) fail("expected a count at offset " + std::to_string(at) + form);
    if (count > 1'000'000)
      fail("count " + std::to_string(count) + " at offset " + std::to_string(at) + " is above 1000000");
    if (i < text.size() && text[i] == '(') {
      if (i + 1 >= text.size() || text[i + 1] != 'x') fail("expected '(x' at offset " + std::to_string(i) + form);
      i += 2;
      const size_t r = i;
      if (!number(i, repeat)) fail("expected a repeat count at offset " + std::to_string(r) + form);
      if (repeat == 0) fail("repeat count 0 at offset " + std::to_string(r) + form);
      if (i >= text.size() || text[i] != ')') fail("expected ')' at offset " + std::to_string(i) + form);
      ++i;
    }
    if (repeat > kMaxNodeEntries - out.size()) {
      fail("describes more than " + std::to_string(kMaxNodeEntries) + " nodes");
    }
    out.insert(out.end(), static_cast<size_t>(repeat), static_cast<int>(count));
    if (i == text.size()) return out;
    if (text[i] != ',') {
      fail("unexpected '" + std::string(1, text[i]) + "' at offset " + std::to_string(i) + form);
    }
    ++i;
  }
}

}  // namespace lspawn::slurm
