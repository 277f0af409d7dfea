// The hang report's analysis, from hand-made records (no processes): who waits where, who is
// behind and how it is said.
#include <catch2/catch.hpp>

#include "hang/hang_report.hpp"
#include "status/stack_dump.hpp"

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

TEST_CASE("hang report: a Python rank's stack is shown as Python prints it, a native one numbered", "[hang]") {
  std::vector<RankInput> ranks;
  ranks.push_back(rank_with(0, {slot("world", 3, true, 4, kNow - 2 * kSec, 3)}));
  ranks.push_back(rank_with(1, {slot("world", 3, false, 3, kNow - 2 * kSec, 3)}));
  ranks.push_back(rank_with(2, {slot("world", 3, false, 3, kNow - 2 * kSec, 3)}));
  // The lines after "pid N python" of python/lspawn_hang.py's stack file.
  ranks[1].stack = {status::kPythonStackHead, "  File \"train.py\", line 16, in sleepy", "    time.sleep(600)"};
  ranks[2].stack = {"/lib/libc.so.6(nanosleep+0x13) [0x7f00]", "prog(_ZN3foo3barEv+0x10) [0x5500]"};
  const auto a = analyse_hang(ranks, kNow);
  REQUIRE(a.lagging == std::vector<int>{1, 2});
  const auto text = format_hang_report("hang: test", a, ranks);
  INFO(text);
  CHECK(text.find("lspawn:   main thread of rank 1 (pid 101), Python, most recent call last:\n"
                  "lspawn:     File \"train.py\", line 16, in sleepy\n"
                  "lspawn:       time.sleep(600)\n") != std::string::npos);
  CHECK(text.find(status::kPythonStackHead) == std::string::npos);  // the marker is not printed
  CHECK(text.find("lspawn:   main thread of rank 2 (pid 102):\n"
                  "lspawn:     #0 /lib/libc.so.6(nanosleep+0x13) [0x7f00]\n"
                  "lspawn:     #1 prog(foo::bar()+0x10) [0x5500]\n") != std::string::npos);
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
  CHECK(a.behind[0] ==
        "rank 1 has no status record: it has not started lspawn's runtime or collectives (a Python worker: "
        "python/lspawn_hang.py) (started 3.0 s ago)");
  CHECK(a.behind[1] == "rank 2 has exited (process 2 exited with code 0)");
  CHECK(a.lagging == std::vector<int>{1});  // no stack to ask of an exited rank

  // Nobody inside a collective: nothing is "behind", every rank is just described.
  ranks[0] = rank_with(0, {slot("world", 3, false, 5, kNow - 2 * kSec, 5)});
  a = analyse_hang(ranks, kNow);
  CHECK_FALSE(a.any_in_collective);
  CHECK(a.behind.empty());
  CHECK(a.other.size() == 3);
  CHECK(a.other[0] ==
        "rank 0 has not entered a collective for 2.0 s (last completed: all_reduce #5 on group world, 2.0 s ago)");
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

// ---- HangWatch over real records (written here by status::Recorder, no worker processes) ----

#include <thread>

#include <unistd.h>

#include "hang/hang_watch.hpp"
#include "status/recorder.hpp"
#include "status/stack_dump.hpp"
#include "support/temp_dir.hpp"

using lspawn::sys::Clock;
using lspawn::test::TempDir;

namespace {

std::vector<WorkerResult> two_workers() {
  std::vector<WorkerResult> w(2);
  for (int r = 0; r < 2; ++r) {
    w[r].rank = r;
    w[r].pid = ::getpid();
  }
  return w;
}

// Polls `watch` on its deadlines for up to `limit`; returns whether it fired.
bool drive(HangWatch& watch, const std::vector<WorkerResult>& workers, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    const auto due = std::min(watch.next_deadline(), end);
    std::this_thread::sleep_until(due);
    if (watch.poll(Clock::now(), workers)) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("HangWatch: fires once when a rank waits and nothing changes for the timeout", "[hang]") {
  TempDir dir;
  auto r0 = status::Recorder::create(dir.path, 0);
  auto r1 = status::Recorder::create(dir.path, 1);
  auto s0 = r0->add_group("world", 0, 2);
  auto s1 = r1->add_group("world", 1, 2);
  s0.enter("all_reduce", 1, 4);
  s0.complete(1);
  s1.enter("all_reduce", 1, 4);
  s1.complete(1);
  s0.enter("all_reduce", 2, 4);  // rank 1 never does
  std::vector<std::string> printed;
  HangWatchOptions o;
  o.dir = dir.path;
  o.timeout = std::chrono::milliseconds(200);
  o.stack_wait = std::chrono::milliseconds(50);
  o.print = [&](const std::string& t) { printed.push_back(t); };
  HangWatch watch(o);
  const auto t0 = Clock::now();
  REQUIRE(drive(watch, two_workers(), std::chrono::seconds(5)));
  CHECK(Clock::now() - t0 >= std::chrono::milliseconds(200));
  CHECK(watch.fired());
  REQUIRE(printed.size() == 1);
  INFO(printed[0]);
  CHECK(printed[0].find("lspawn: hang: no rank made progress in its collectives for ") == 0);
  CHECK(printed[0].find("(--hang-timeout 0.2)") != std::string::npos);
  CHECK(printed[0].find("waiting: rank 0 in all_reduce #2 on group world, 4 B") != std::string::npos);
  CHECK(printed[0].find("behind: rank 1 has not entered a collective") != std::string::npos);
  // Recorder::create installs no handler: the report says why there is no stack.
  CHECK(printed[0].find("main thread of rank 1: no stack (its runtime did not install the stack handler)") !=
        std::string::npos);
  CHECK_FALSE(drive(watch, two_workers(), std::chrono::milliseconds(300)));  // once
}

TEST_CASE("HangWatch: progress or nobody waiting is not a hang, a report on request", "[hang]") {
  TempDir dir;
  auto r0 = status::Recorder::create(dir.path, 0);
  auto r1 = status::Recorder::create(dir.path, 1);
  auto s0 = r0->add_group("world", 0, 2);
  auto s1 = r1->add_group("world", 1, 2);
  std::vector<std::string> printed;
  HangWatchOptions o;
  o.dir = dir.path;
  o.timeout = std::chrono::milliseconds(150);
  o.print = [&](const std::string& t) { printed.push_back(t); };
  HangWatch watch(o);
  // Both compute, nobody in a collective, for twice the timeout.
  CHECK_FALSE(drive(watch, two_workers(), std::chrono::milliseconds(400)));
  // Rank 0 waits, but rank 1 keeps making progress on another group.
  auto other = r1->add_group("world.1", 0, 1);
  s0.enter("all_reduce", 1, 4);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    for (std::uint64_t i = 1; !stop; ++i) {
      other.enter("barrier", i, 0);
      other.complete(i);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  CHECK_FALSE(drive(watch, two_workers(), std::chrono::milliseconds(500)));
  stop = true;
  busy.join();
  CHECK(printed.empty());
  watch.request_report();
  CHECK_FALSE(drive(watch, two_workers(), std::chrono::milliseconds(100)));  // a report, not a hang
  REQUIRE(printed.size() == 1);
  CHECK(printed[0].find("lspawn: status of 2 ranks (on request)") == 0);
  CHECK(printed[0].find("waiting: rank 0 in all_reduce #1 on group world") != std::string::npos);
  (void)s1;
}

namespace {

// Rank `rank` of another node as its launcher sends it: waiting in all_reduce #seq, or idle.
RankInput remote_rank(int rank, bool waiting, std::uint64_t seq, std::uint64_t version) {
  RankInput in;
  in.rank = rank;
  in.pid = 999999;
  in.host = "node-b";
  status::RankView v;
  v.rank = rank;
  v.pid = in.pid;
  v.stack_signal = status::kStackSignal;
  status::GroupView g;
  g.name = "world";
  g.group_rank = rank;
  g.group_size = 4;
  g.in_collective = waiting;
  g.seq = seq;
  g.op = "all_reduce";
  g.bytes = 4;
  g.since_us = status::now_us();
  g.completed_seq = waiting ? seq - 1 : seq;
  g.completed_op = "all_reduce";
  g.completed_us = g.since_us;
  g.version = version;
  v.groups.push_back(g);
  in.record = v;
  return in;
}

}  // namespace

TEST_CASE(
    "HangWatch, coordinator: another node's ranks count for progress and are in the report - their stacks "
    "are asked of their launcher",
    "[hang]") {
  TempDir dir;
  auto r0 = status::Recorder::create(dir.path, 0);
  auto r1 = status::Recorder::create(dir.path, 1);
  auto s0 = r0->add_group("world", 0, 4);
  auto s1 = r1->add_group("world", 1, 4);
  s0.enter("all_reduce", 2, 4);
  s1.enter("all_reduce", 2, 4);
  std::vector<std::string> printed;
  std::vector<std::pair<int, std::vector<int>>> asked;
  HangWatchOptions o;
  o.dir = dir.path;
  o.timeout = std::chrono::milliseconds(300);
  o.stack_wait = std::chrono::milliseconds(2000);
  o.print = [&](const std::string& t) { printed.push_back(t); };
  o.ask_remote_stacks = [&](int node, const std::vector<int>& ranks) { asked.emplace_back(node, ranks); };
  HangWatch watch(o);
  // Node 1's rank 2 waits too; its rank 3 keeps making progress (its version changes) for a while.
  std::uint64_t version = 1;
  const auto until = Clock::now() + std::chrono::milliseconds(600);
  while (Clock::now() < until) {
    watch.set_remote(1, {remote_rank(2, true, 2, 1), remote_rank(3, false, 1, ++version)});
    CHECK_FALSE(watch.poll(Clock::now(), two_workers()));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(printed.empty());  // remote progress is progress
  // Now nothing changes anywhere: the watch fires and asks node 1 for rank 3's stack.
  const auto t0 = Clock::now();
  while (asked.empty() && Clock::now() - t0 < std::chrono::seconds(5)) {
    watch.poll(Clock::now(), two_workers());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(asked.size() == 1);
  CHECK(asked[0].first == 1);
  CHECK(asked[0].second == std::vector<int>{3});
  CHECK(printed.empty());  // waits for the answer
  RankInput answer;
  answer.rank = 3;
  answer.stack = {"pid 1 main thread", "/w(lspawn_test::sleep_outside_collectives()+0x1c) [0x55]"};
  answer.stack.erase(answer.stack.begin());
  watch.add_remote_stacks({answer});
  CHECK(drive(watch, two_workers(), std::chrono::seconds(2)));
  REQUIRE(printed.size() == 1);
  INFO(printed[0]);
  CHECK(printed[0].find("waiting: ranks 0-2 in all_reduce #2 on group world, 4 B") != std::string::npos);
  CHECK(printed[0].find("(3 of 4 members)") != std::string::npos);
  CHECK(printed[0].find("behind: rank 3 on node-b has not entered a collective") != std::string::npos);
  CHECK(printed[0].find("lspawn_test::sleep_outside_collectives()") != std::string::npos);
  CHECK(watch.last_report() == printed[0]);
}

TEST_CASE("HangWatch, coordinator: a launcher that never sends the stacks is named after the stack wait", "[hang]") {
  TempDir dir;
  auto r0 = status::Recorder::create(dir.path, 0);
  auto s0 = r0->add_group("world", 0, 2);
  s0.enter("all_reduce", 1, 4);
  std::vector<std::string> printed;
  HangWatchOptions o;
  o.dir = dir.path;
  o.timeout = std::chrono::milliseconds(100);
  o.stack_wait = std::chrono::milliseconds(200);
  o.print = [&](const std::string& t) { printed.push_back(t); };
  o.ask_remote_stacks = [](int, const std::vector<int>&) {};  // the answer never comes
  HangWatch watch(o);
  watch.set_remote(1, {remote_rank(1, false, 0, 1)});
  std::vector<WorkerResult> one(1);
  one[0].rank = 0;
  one[0].pid = ::getpid();
  REQUIRE(drive(watch, one, std::chrono::seconds(5)));
  REQUIRE(printed.size() == 1);
  INFO(printed[0]);
  CHECK(printed[0].find("main thread of rank 1") != std::string::npos);
  CHECK(printed[0].find("its node's lspawn sent no answer within 0.2 s") != std::string::npos);
}

// launcher/run.cpp's loop: next_deadline() read before each wait, poll() only once it is due;
// the waits end every few ms (a coordinator's thousands of nodes' status messages). A deadline
// counted from each call's "now" moved ahead on every turn and the report on request was never
// made (bench/scale: 38 s at 256 nodes, until a wait happened to be longer than 20 ms).
TEST_CASE("HangWatch: a report on request is made by a caller that wakes more often than the watch polls", "[hang]") {
  TempDir dir;
  auto r0 = status::Recorder::create(dir.path, 0);
  auto s0 = r0->add_group("world", 0, 2);
  s0.enter("all_reduce", 1, 4);
  std::vector<std::string> printed;
  std::vector<int> asked_node;
  HangWatchOptions o;
  o.dir = dir.path;
  o.stack_wait = std::chrono::milliseconds(2000);
  o.print = [&](const std::string& t) { printed.push_back(t); };
  o.ask_remote_stacks = [&](int node, const std::vector<int>&) { asked_node.push_back(node); };
  HangWatch watch(o);
  watch.set_remote(1, {remote_rank(1, false, 0, 1)});  // rank 1 is behind: its stack is asked
  std::vector<WorkerResult> one(1);
  one[0].rank = 0;
  one[0].pid = ::getpid();
  watch.request_report();
  const auto end = Clock::now() + std::chrono::seconds(1);
  while (printed.empty() && Clock::now() < end) {
    const auto due = watch.next_deadline();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // woken by something else
    if (Clock::now() < due) continue;
    watch.poll(Clock::now(), one);
    if (asked_node.size() == 1 && printed.empty()) {
      RankInput answer;
      answer.rank = 1;
      answer.stack = {"/w(main+0x1c) [0x55]"};
      watch.add_remote_stacks({answer});
    }
  }
  REQUIRE(asked_node == std::vector<int>{1});
  REQUIRE(printed.size() == 1);
  CHECK(printed[0].find("(on request)") != std::string::npos);
  CHECK(printed[0].find("/w(main+0x1c) [0x55]") != std::string::npos);
  // With nothing pending and no --hang-timeout, the watch wants no wake-up at all.
  CHECK(watch.next_deadline() == Clock::time_point::max());
}

TEST_CASE(
    "HangWatch, member: the coordinator's stack request is answered for its ranks, and names the ones it "
    "does not have",
    "[hang]") {
  TempDir dir;
  auto r0 = status::Recorder::create(dir.path, 0);  // no stack handler installed
  HangWatchOptions o;
  o.dir = dir.path;
  o.stack_wait = std::chrono::milliseconds(100);
  HangWatch watch(o);
  std::vector<WorkerResult> one(1);
  one[0].rank = 0;
  one[0].pid = ::getpid();
  std::optional<std::vector<RankInput>> answer;
  watch.ask_stacks_for({0, 7}, one, [&](std::vector<RankInput> a) { answer = std::move(a); });
  drive(watch, one, std::chrono::milliseconds(300));
  REQUIRE(answer);
  REQUIRE(answer->size() == 2);
  CHECK((*answer)[0].rank == 0);
  CHECK((*answer)[0].stack_problem == "its runtime did not install the stack handler");
  CHECK((*answer)[1].rank == 7);
  CHECK((*answer)[1].stack_problem == "not a rank of this node");
}
