// The hang report: from every rank's status record (status/reader.hpp), which ranks wait in which
// collective, which ranks are behind and where, and the main-thread stacks of the ranks behind
// (docs/hang-diagnosis.md has the format and a real example).
//
// A pure function of its input: the records may come from this node's files (HangWatch) or, for
// a multi-node job, from other nodes' launchers; merging is concatenating RankInputs (records carry
// CLOCK_REALTIME times, so "for 41 s" across nodes is as good as their clocks' agreement).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "status/reader.hpp"

namespace lspawn {

// What is known of one rank.
struct RankInput {
  int rank = -1;
  int pid = 0;                             // the supervisor's pid for it; 0 unknown
  std::string host;                        // empty: this node
  bool exited = false;                     // its process is gone
  std::string exit_text;                   // "exited with code 0", when exited
  std::int64_t started_us = 0;             // when it was started (CLOCK_REALTIME µs), 0 unknown
  std::optional<status::RankView> record;  // none: no status record (yet)
  std::string record_problem;              // a record that exists but could not be read
  std::vector<std::string> stack;          // its main thread's frames, when fetched
  std::string stack_problem;               // why there is no stack ("no handler", "no answer in 1 s")
};

struct HangAnalysis {
  // One line per cluster of waiting ranks and per rank behind / elsewhere, without "lspawn: ".
  std::vector<std::string> waiting;
  std::vector<std::string> behind;
  std::vector<std::string> other;
  std::vector<int> lagging;  // ranks behind: the ones whose stacks matter
  bool any_in_collective = false;
};

// `now_us`: CLOCK_REALTIME µs of the report.
HangAnalysis analyse_hang(const std::vector<RankInput>& ranks, std::int64_t now_us);

// The whole report, every line prefixed "lspawn: ": `headline`, the analysis, the stacks of the
// lagging ranks (demangled).
std::string format_hang_report(const std::string& headline, const HangAnalysis& a, const std::vector<RankInput>& ranks);

// "16 MiB", "4 B", "1.5 KiB".
std::string format_bytes(std::uint64_t bytes);
// "0-2, 5, 7-8".
std::string format_ranks(std::vector<int> ranks);
// A backtrace_symbols line with its C++ symbol demangled:
// "lib.so(_ZN3foo3barEv+0x10) [0x7f..]" → "lib.so(foo::bar()+0x10) [0x7f..]".
std::string demangle_frame(const std::string& line);

}  // namespace lspawn
