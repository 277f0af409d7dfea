// The hang report's analysis, from hand-made records (no processes): who waits where, who is
// behind and how it is said.
#include <catch2/catch.hpp>

#include "launcher/hang_report.hpp"

using namespace lspawn;

namespace {

constexpr std::int64_t kNow = 1'000'000'000'000;
constexpr std::int64_t kSec = 1'000'000;

status::GroupView slot(const std::string& name, int size, bool in, std::uint64_t seq, std::int64_t since,
                       std::uint64_t completed, std::uint64_t bytes = 16u << 20) {
  status::GroupView g;
  g.name = name;
  g.group_size = size;
  g.in_collective = in;
  g.seq = seq;
  g.op = "all_reduce";
  g.bytes = bytes;
  g.since_us = since;
  g.completed_seq = completed;
  g.completed_op = completed ? "all_reduce" : "";
  g.completed_us = since;
  return g;
}

RankInput rank_with(int r, std::vector<status::GroupView> groups) {
  RankInput in;
  in.rank = r;
  in.pid = 100 + r;
  status::RankView v;
  v.rank = r;
  v.pid = in.pid;
  v.opened_us = kNow - 60 * kSec;
  v.groups = std::move(groups);
  in.record = v;
  return in;
}

std::string all(const HangAnalysis& a) {
  std::string s;
  for (const auto* part : {&a.waiting, &a.behind, &a.other})
    for (const auto& l : *part) s += l + "\n";
  return s;
}

}  // namespace

TEST_CASE("hang report: a rank that has not entered the collective the others wait in", "[hang]") {
  std::vector<RankInput> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(rank_with(r, {slot("world", 4, true, 1043, kNow - 41 * kSec, 1042)}));
  ranks.push_back(rank_with(3, {slot("world", 4, false, 1042, kNow - 41 * kSec, 1042)}));
  const auto a = analyse_hang(ranks, kNow);
  INFO(all(a));
  REQUIRE(a.waiting.size() == 1);
  CHECK(a.waiting[0] == "waiting: ranks 0-2 in all_reduce #1043 on group world, 16 MiB, for 41 s (3 of 4 members)");
  REQUIRE(a.behind.size() == 1);
  CHECK(a.behind[0] ==
        "rank 3 has not entered a collective for 41 s, the others wait in all_reduce #1043 on group world "
        "(last completed: all_reduce #1042 on group world, 41 s ago)");
  CHECK(a.lagging == std::vector<int>{3});
  CHECK(a.any_in_collective);

  const auto text = format_hang_report("hang: test", a, ranks);
  CHECK(text.rfind("lspawn: hang: test\n", 0) == 0);
  CHECK(text.find("lspawn:   behind: rank 3 has not entered") != std::string::npos);
}

TEST_CASE("hang report: a rank still in the previous op", "[hang]") {
  std::vector<RankInput> ranks;
  ranks.push_back(rank_with(0, {slot("world", 2, true, 1043, kNow - 5 * kSec, 1042)}));
  ranks.push_back(rank_with(1, {slot("world", 2, true, 1042, kNow - 7 * kSec, 1041)}));
  const auto a = analyse_hang(ranks, kNow);
  INFO(all(a));
  REQUIRE(a.behind.size() == 1);
  CHECK(a.behind[0] ==
        "rank 1 still in all_reduce #1042 on group world, 16 MiB, for 7.0 s (the others wait in all_reduce #1043 on "
        "group world)");
  CHECK(a.lagging == std::vector<int>{1});
}

TEST_CASE("hang report: ranks without a record, exited ranks, nobody in a collective", "[hang]") {
  std::vector<RankInput> ranks;
  ranks.push_back(rank_with(0, {slot("world", 3, true, 5, kNow - 2 * kSec, 4, 4)}));
  RankInput none;
  none.rank = 1;
  none.started_us = kNow - 3 * kSec;
  ranks.push_back(none);
  RankInput gone;
  gone.rank = 2;
  gone.exited = true;
  gone.exit_text = "has exited (process 2 exited with code 0)";
  ranks.push_back(gone);
  auto a = analyse_hang(ranks, kNow);
  INFO(all(a));
  CHECK(a.waiting.at(0) == "waiting: rank 0 in all_reduce #5 on group world, 4 B, for 2.0 s (1 of 3 members)");
  REQUIRE(a.behind.size() == 2);
  CHECK(a.behind[0] == "rank 1 has no status record: it has not started lspawn's runtime or collectives (started 3.0 s ago)");
  CHECK(a.behind[1] == "rank 2 has exited (process 2 exited with code 0)");
  CHECK(a.lagging == std::vector<int>{1});  // no stack to ask of an exited rank

  // Nobody inside a collective: nothing is "behind", every rank is just described.
  ranks[0] = rank_with(0, {slot("world", 3, false, 5, kNow - 2 * kSec, 5)});
  a = analyse_hang(ranks, kNow);
  CHECK_FALSE(a.any_in_collective);
  CHECK(a.behind.empty());
  CHECK(a.other.size() == 3);
  CHECK(a.other[0] == "rank 0 has not entered a collective for 2.0 s (last completed: all_reduce #5 on group world, 2.0 s ago)");
}

TEST_CASE("hang report: formatting helpers", "[hang]") {
  CHECK(format_bytes(4) == "4 B");
  CHECK(format_bytes(16u << 20) == "16 MiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_ranks({3, 0, 1, 2, 5, 7, 8}) == "0-3, 5, 7, 8");
  CHECK(format_ranks({4}) == "4");
  CHECK(demangle_frame("./w(_ZN11lspawn_test25sleep_outside_collectivesEv+0x1c) [0x55]") ==
        "./w(lspawn_test::sleep_outside_collectives()+0x1c) [0x55]");
  CHECK(demangle_frame("/lib/libc.so.6(clock_nanosleep+0xdf) [0x7f]") == "/lib/libc.so.6(clock_nanosleep+0xdf) [0x7f]");
  CHECK(demangle_frame("./w(+0x1234) [0x55]") == "./w(+0x1234) [0x55]");
}
