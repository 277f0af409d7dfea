#include "hang/hang_report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <cxxabi.h>

#include "status/stack_dump.hpp"
#include "sys/duration_text.hpp"

namespace lspawn {
namespace {

std::string secs(std::int64_t us) { return elapsed_text(std::chrono::microseconds(us)); }

std::string op_text(const std::string& op, std::uint64_t seq, const std::string& group) {
  return op + " #" + std::to_string(seq) + " on group " + group;
}

std::string where(const RankInput& r) { return r.host.empty() ? "" : " on " + r.host; }

// The slot a rank is waiting in: the in-collective one entered last.
const status::GroupView* active_slot(const status::RankView& v) {
  const status::GroupView* best = nullptr;
  for (const auto& g : v.groups)
    if (g.in_collective && (!best || g.since_us > best->since_us)) best = &g;
  return best;
}

const status::GroupView* slot_named(const status::RankView& v, const std::string& name) {
  for (const auto& g : v.groups)
    if (g.name == name) return &g;
  return nullptr;
}

// When the rank last entered or left a collective (0: never).
std::int64_t last_activity_us(const status::RankView& v) {
  std::int64_t t = 0;
  for (const auto& g : v.groups) t = std::max(t, g.since_us);
  return t;
}

// "last completed: all_reduce #1042 on group world, 41 s ago" for the rank's most recent completion.
std::string last_completed(const status::RankView& v, std::int64_t now_us, const std::string& prefer_group) {
  const status::GroupView* best = nullptr;
  if (const auto* g = slot_named(v, prefer_group); g && g->completed_seq) best = g;
  if (!best)
    for (const auto& g : v.groups)
      if (g.completed_seq && (!best || g.completed_us > best->completed_us)) best = &g;
  if (!best) return "no collective completed yet";
  return "last completed: " + op_text(best->completed_op, best->completed_seq, best->name) + ", " +
         secs(now_us - best->completed_us) + " ago";
}

}  // namespace

std::string format_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else if (v == static_cast<double>(static_cast<long long>(v)))
    std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(v), units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string demangle_frame(const std::string& line) {
  const auto open = line.find('(');
  if (open == std::string::npos) return line;
  const auto end = line.find_first_of("+)", open + 1);
  if (end == std::string::npos || end == open + 1) return line;
  const std::string sym = line.substr(open + 1, end - open - 1);
  int status = 0;
  char* d = abi::__cxa_demangle(sym.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !d) return line;
  std::string out = line.substr(0, open + 1) + d + line.substr(end);
  std::free(d);
  return out;
}

HangAnalysis analyse_hang(const std::vector<RankInput>& ranks, std::int64_t now_us) {
  HangAnalysis a;
  // 1. Waiting clusters: (group, seq, op) → ranks.
  using Key = std::tuple<std::string, std::uint64_t, std::string>;
  std::map<Key, std::vector<int>> clusters;
  std::map<Key, std::pair<std::uint64_t, std::int64_t>> cluster_info;  // bytes, earliest entry
  std::map<std::string, std::uint64_t> frontier;                       // group → highest seq waited in
  std::map<std::string, int> group_size;
  for (const auto& r : ranks) {
    if (!r.record || r.exited) continue;
    if (const auto* s = active_slot(*r.record)) {
      a.any_in_collective = true;
      Key k{s->name, s->seq, s->op};
      clusters[k].push_back(r.rank);
      auto& info = cluster_info[k];
      if (!info.second || s->since_us < info.second) info = {s->bytes, s->since_us};
      frontier[s->name] = std::max(frontier[s->name], s->seq);
      group_size[s->name] = s->group_size;
    }
  }
  // Clusters in order: the groups' frontiers first, then older ops.
  std::vector<std::pair<Key, std::vector<int>>> ordered(clusters.begin(), clusters.end());
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& x, const auto& y) { return std::get<1>(x.first) > std::get<1>(y.first); });
  std::set<int> placed;
  for (const auto& [k, rs] : ordered) {
    const auto& [group, seq, op] = k;
    const auto& info = cluster_info[k];
    std::ostringstream line;
    line << "waiting: rank" << (rs.size() > 1 ? "s " : " ") << format_ranks(rs) << " in " << op_text(op, seq, group)
         << ", " << format_bytes(info.first) << ", for " << secs(now_us - info.second);
    if (group_size.count(group)) line << " (" << rs.size() << " of " << group_size[group] << " members)";
    a.waiting.push_back(line.str());
    if (seq == frontier[group]) placed.insert(rs.begin(), rs.end());
  }
  // 2. Behind: members of a group with waiting ranks that are not in its frontier op.
  std::set<int> lagging;
  for (const auto& r : ranks) {
    std::string line = "rank " + std::to_string(r.rank) + where(r);
    bool behind = false;
    if (placed.count(r.rank) && (r.exited || !r.record)) continue;
    if (r.exited) {
      line += " " + (r.exit_text.empty() ? std::string("exited") : r.exit_text);
      behind = a.any_in_collective;
      if (behind)
        a.behind.push_back(line);
      else
        a.other.push_back(line);
      continue;
    }
    if (!r.record) {
      line +=
          " has no status record: it has not started lspawn's runtime or collectives (a Python worker: "
          "python/lspawn_hang.py)";
      if (r.started_us) line += " (started " + secs(now_us - r.started_us) + " ago)";
      if (!r.record_problem.empty()) line += " (" + r.record_problem + ")";
      if (a.any_in_collective) {
        a.behind.push_back(line);
        lagging.insert(r.rank);
      } else {
        a.other.push_back(line);
      }
      continue;
    }
    const auto& v = *r.record;
    // The groups it belongs to where others wait ahead of it.
    std::string missed;
    for (const auto& [group, seq] : frontier) {
      const auto* mine = slot_named(v, group);
      if (!mine) continue;
      if (mine->in_collective && mine->seq == seq) continue;
      behind = true;
      if (missed.empty()) {
        // The op the others wait in, named from any waiting rank's slot.
        for (const auto& [k, rs] : clusters)
          if (std::get<0>(k) == group && std::get<1>(k) == seq) missed = op_text(std::get<2>(k), seq, group);
      }
    }
    if (const auto* s = active_slot(v)) {
      line += (behind ? " still in " : " in ") + op_text(s->op, s->seq, s->name) + ", " + format_bytes(s->bytes) +
              ", for " + secs(now_us - s->since_us);
      if (behind && !missed.empty()) line += " (the others wait in " + missed + ")";
    } else {
      const std::int64_t last = last_activity_us(v);
      line += " has not entered a collective for " + secs(now_us - (last ? last : v.opened_us));
      if (behind && !missed.empty()) line += ", the others wait in " + missed;
      line += " (" + last_completed(v, now_us, "") + ")";
    }
    if (v.torn) line += " [record being written: its writer may have died mid-update]";
    if (behind) {
      a.behind.push_back(line);
      lagging.insert(r.rank);
    } else if (!placed.count(r.rank)) {
      a.other.push_back(line);
    }
  }
  a.lagging.assign(lagging.begin(), lagging.end());
  return a;
}

std::string format_hang_report(const std::string& headline, const HangAnalysis& a,
                               const std::vector<RankInput>& ranks) {
  std::ostringstream os;
  os << "lspawn: " << headline << "\n";
  for (const auto& l : a.waiting) os << "lspawn:   " << l << "\n";
  for (const auto& l : a.behind) os << "lspawn:   behind: " << l << "\n";
  for (const auto& l : a.other) os << "lspawn:   " << l << "\n";
  if (a.waiting.empty() && a.behind.empty() && a.other.empty()) os << "lspawn:   no rank to report\n";
  for (int rank : a.lagging) {
    for (const auto& r : ranks) {
      if (r.rank != rank) continue;
      if (!r.stack.empty() && r.stack.front() == status::kPythonStackHead) {
        os << "lspawn:   main thread of rank " << rank << " (pid " << r.pid << where(r)
           << "), Python, most recent call last:\n";
        for (std::size_t i = 1; i < r.stack.size(); ++i) os << "lspawn:   " << r.stack[i] << "\n";
      } else if (!r.stack.empty()) {
        os << "lspawn:   main thread of rank " << rank << " (pid " << r.pid << where(r) << "):\n";
        int i = 0;
        for (const auto& f : r.stack) os << "lspawn:     #" << i++ << " " << demangle_frame(f) << "\n";
      } else if (!r.stack_problem.empty()) {
        os << "lspawn:   main thread of rank " << rank << ": no stack (" << r.stack_problem << ")\n";
      }
    }
  }
  return os.str();
}

}  // namespace lspawn
