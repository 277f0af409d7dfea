#include "launchenv/slurm_hostlist.hpp"

#include <cstdint>

namespace lspawn::slurm {
namespace {

// One "[...]" group: its ranges, each printed with the width of its lower bound as written.
struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;
};
struct Group {
  std::vector<Range> ranges;
  uint64_t count = 0;  // names it yields (<= kMaxHosts + 1, saturated)
};
// text0 [group0] text1 [group1] ... textN: groups.size() + 1 == texts.size().
struct Item {
  std::vector<std::string> texts;
  std::vector<Group> groups;
  uint64_t count = 1;  // product of the groups' counts (saturated above max)
};

class Parser {
 public:
  Parser(std::string_view text, const std::string& variable, size_t max_hosts)
      : s_(text), var_(variable), max_(max_hosts) {}

  [[noreturn]] void fail(const std::string& problem) const { throw EnvSyntaxError(var_, std::string(s_), problem); }

  std::vector<Item> parse() {
    if (s_.empty()) fail("empty hostlist: expected names such as n[01-04,07],gpu-a[1-2]");
    std::vector<Item> items;
    uint64_t total = 0;
    size_t i = 0;
    while (i <= s_.size()) {
      Item item = parse_item(i);  // stops at a top-level separator or the end
      // Empty items are skipped, as Slurm does ("a,,b", "a, b": a b).
      if (!(item.groups.empty() && item.texts.back().empty())) {
        total += item.count;
        if (total > max_) fail("expands to more than " + std::to_string(max_) + " hosts");
        items.push_back(std::move(item));
      }
      ++i;  // past the separator (or the end)
    }
    if (items.empty()) fail("no host names (only separators)");
    return items;
  }

 private:
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  Item parse_item(size_t& i) {
    Item item;
    item.texts.emplace_back();
    while (i < s_.size()) {
      const char c = s_[i];
      if (c == ',' || is_space(c)) break;
      if (c == ']') fail("']' at offset " + std::to_string(i) + " without a matching '['");
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        fail("control character at offset " + std::to_string(i));
      }
      if (c == '[') {
        Group g = parse_group(i);  // i: past the ']'
        item.count = item.count > max_ || g.count > max_ ? max_ + 1
                     : item.count * g.count > max_       ? max_ + 1
                                                         : item.count * g.count;
        item.groups.push_back(std::move(g));
        item.texts.emplace_back();
        continue;
      }
      item.texts.back().push_back(c);
      ++i;
    }
    if (item.groups.empty() && item.texts.back().empty()) return item;  // empty: caller decides
    if (item.count > max_) fail("expands to more than " + std::to_string(max_) + " hosts");
    return item;
  }

  // At '[': reads "lo[-hi]{,lo[-hi]}]".
  Group parse_group(size_t& i) {
    const size_t open = i++;
    Group g;
    for (;;) {
      if (i >= s_.size()) fail("'[' at offset " + std::to_string(open) + " is never closed");
      Range r;
      r.width = 0;
      r.lo = number(i, open, &r.width);
      r.hi = r.lo;
      if (i < s_.size() && s_[i] == '-') {
        ++i;
        r.hi = number(i, open, nullptr);
        if (r.hi < r.lo) {
          fail("range " + std::to_string(r.lo) + "-" + std::to_string(r.hi) + " at offset " + std::to_string(open) +
               " goes down (expected lo-hi with lo <= hi)");
        }
      }
      const uint64_t n = r.hi - r.lo + 1;
      g.count = (n > max_ || g.count + n > max_) ? max_ + 1 : g.count + n;
      if (g.count > max_) fail("expands to more than " + std::to_string(max_) + " hosts");
      g.ranges.push_back(r);
      if (i >= s_.size()) fail("'[' at offset " + std::to_string(open) + " is never closed");
      if (s_[i] == ',') {
        ++i;
        continue;
      }
      if (s_[i] == ']') {
        ++i;
        return g;
      }
      if (s_[i] == '[') fail("'[' at offset " + std::to_string(i) + " inside another '['");
      if (s_[i] == 'x')
        fail("'x' at offset " + std::to_string(i) + ": multi-dimensional (prism) ranges are not supported");
      fail("unexpected '" + std::string(1, s_[i]) + "' at offset " + std::to_string(i) +
           " in the range list (expected digits, '-', ',' or ']')");
    }
  }

  uint64_t number(size_t& i, size_t open, size_t* width) {
    const size_t b = i;
    while (i < s_.size() && s_[i] >= '0' && s_[i] <= '9') ++i;
    if (i == b) {
      if (i >= s_.size()) fail("'[' at offset " + std::to_string(open) + " is never closed");
      fail("expected a number at offset " + std::to_string(b) + " in the range list, got '" + std::string(1, s_[b]) +
           "'");
    }
    if (i - b > 18) fail("number at offset " + std::to_string(b) + " has more than 18 digits");
    uint64_t v = 0;
    for (size_t k = b; k < i; ++k) v = v * 10 + static_cast<uint64_t>(s_[k] - '0');
    if (width) *width = i - b;
    return v;
  }

  std::string_view s_;
  const std::string& var_;
  size_t max_;
};

std::string padded(uint64_t v, size_t width) {
  std::string digits = std::to_string(v);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Appends the names of `item` (groups expanded as a product, first group outermost); stops after
// `limit` names in all.
void expand_item(const Item& item, std::vector<std::string>& out, size_t limit) {
  // Odometer over the groups: idx[g] = (range index, value).
  const size_t ng = item.groups.size();
  std::vector<size_t> range(ng, 0);
  std::vector<uint64_t> value(ng);
  for (size_t g = 0; g < ng; ++g) value[g] = item.groups[g].ranges[0].lo;
  for (;;) {
    if (out.size() >= limit) return;
    std::string name = item.texts[0];
    for (size_t g = 0; g < ng; ++g) {
      name += padded(value[g], item.groups[g].ranges[range[g]].width);
      name += item.texts[g + 1];
    }
    out.push_back(std::move(name));
    // advance the last group first
    size_t g = ng;
    for (;;) {
      if (g == 0) return;
      --g;
      const Range& r = item.groups[g].ranges[range[g]];
      if (value[g] < r.hi) {
        ++value[g];
        break;
      }
      if (range[g] + 1 < item.groups[g].ranges.size()) {
        ++range[g];
        value[g] = item.groups[g].ranges[range[g]].lo;
        break;
      }
      range[g] = 0;
      value[g] = item.groups[g].ranges[0].lo;
    }
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view text, const std::string& variable, size_t max_hosts) {
  const std::vector<Item> items = Parser(text, variable, max_hosts).parse();
  std::vector<std::string> out;
  for (const Item& item : items) expand_item(item, out, max_hosts);
  return out;
}

std::string first_host(std::string_view text, const std::string& variable) {
  const std::vector<Item> items = Parser(text, variable, kMaxHosts).parse();
  std::vector<std::string> out;
  expand_item(items.front(), out, 1);
  return out.front();
}

}  // namespace lspawn::slurm
