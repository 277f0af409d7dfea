#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "status/phase.hpp"
#include "status/reader.hpp"
#include "status/recorder.hpp"
#include "status/stack_dump.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"

using namespace lspawn::status;
using lspawn::test::TempDir;

TEST_CASE("status record: what a rank records is what a reader reads", "[status]") {
  TempDir dir;
  auto rec = Recorder::create(dir.path, 3);
  REQUIRE(rec->enabled());
  CHECK(rec->path() == record_path(dir.path, 3));
  auto world = rec->add_group("world", 3, 4);
  auto sub = rec->add_group("world.1", 1, 2);
  auto reader = RecordReader::open(rec->path());
  REQUIRE(reader);

  auto v = reader->read();
  CHECK(v.rank == 3);
  CHECK(v.pid == ::getpid());
  CHECK_FALSE(v.torn);
  REQUIRE(v.groups.size() == 2);
  CHECK(v.groups[0].name == "world");
  CHECK(v.groups[0].group_rank == 3);
  CHECK(v.groups[0].group_size == 4);
  CHECK(v.groups[1].name == "world.1");
  CHECK_FALSE(v.groups[0].in_collective);
  CHECK(v.groups[0].completed_seq == 0);

  const auto before = now_us();
  const auto p0 = reader->progress();
  world.enter("all_reduce", 1043, 16u << 20);
  CHECK(reader->progress() != p0);
  v = reader->read();
  CHECK(v.groups[0].in_collective);
  CHECK(v.groups[0].seq == 1043);
  CHECK(v.groups[0].op == "all_reduce");
  CHECK(v.groups[0].bytes == (16u << 20));
  CHECK(v.groups[0].since_us >= before);
  CHECK_FALSE(v.groups[1].in_collective);

  world.complete(1043);
  v = reader->read();
  CHECK_FALSE(v.groups[0].in_collective);
  CHECK(v.groups[0].completed_seq == 1043);
  CHECK(v.groups[0].completed_op == "all_reduce");
  CHECK(v.groups[0].completed_us >= v.groups[0].since_us - 1);

  SECTION("async ops completing out of order keep the later one in flight") {
    world.enter("broadcast", 1044, 4);
    world.enter("all_gather", 1045, 8);
    world.complete(1044);
    v = reader->read();
    CHECK(v.groups[0].in_collective);
    CHECK(v.groups[0].seq == 1045);
    CHECK(v.groups[0].op == "all_gather");
    CHECK(v.groups[0].completed_seq == 1044);
    world.complete(1045);
    v = reader->read();
    CHECK_FALSE(v.groups[0].in_collective);
    CHECK(v.groups[0].completed_seq == 1045);
  }
  SECTION("long op names are cut, not overflowed") {
    sub.enter("an_op_name_much_longer_than_the_field", 1, 0);
    v = reader->read();
    CHECK(v.groups[1].op == std::string("an_op_name_much_longer_than_the_field").substr(0, 23));
  }
}

TEST_CASE("status record: groups beyond the slots are counted, not recorded, disabled writers do nothing", "[status]") {
  TempDir dir;
  auto rec = Recorder::create(dir.path, 0);
  for (std::uint32_t i = 0; i < kMaxGroups; ++i) CHECK(rec->add_group("g" + std::to_string(i), 0, 1).enabled());
  auto extra = rec->add_group("one-too-many", 0, 1);
  CHECK_FALSE(extra.enabled());
  extra.enter("all_reduce", 1, 4);  // no-op
  auto v = RecordReader::open(rec->path())->read();
  CHECK(v.groups.size() == kMaxGroups);
  CHECK(v.groups_dropped == 1);

  Recorder disabled;
  CHECK_FALSE(disabled.enabled());
  CHECK_FALSE(disabled.add_group("world", 0, 1).enabled());
}

TEST_CASE("status record: a missing record is nullopt, a foreign file is refused", "[status]") {
  TempDir dir;
  CHECK_FALSE(RecordReader::open(dir.path + "/rank-9.status"));
  lspawn::test::write_file(dir.path + "/rank-1.status", "not a record");
  CHECK_THROWS_WITH(RecordReader::open(dir.path + "/rank-1.status"), Catch::Contains("expected"));
  CHECK_THROWS(Recorder::create(dir.path + "/no/such/dir", 0));
}

// The reader's contract: every read it does not flag `torn` is consistent (a seqlock: a writer
// preempted mid-update is waited for up to 250 ms, then the read says `torn` rather than returning
// mixed values). Counted, not timed: each race runs until the reader has returned enough unflagged
// reads, of both states (inside a collective and not: so it overlapped the writer's work), so a slow
// machine (TSan, a loaded CI runner) makes it longer, not failing; the deadline only catches a
// reader that stops returning.
namespace {
struct RaceCounts {
  int reads = 0, unflagged = 0, inside = 0, outside = 0, bad = 0, torn = 0;
};
// `gap`: how long the writer rests between collectives (zero: back to back, never pausing). Checks
// that the race reached its counts and that no unflagged read was mixed; returns the counts.
RaceCounts race_reader_and_writer(std::chrono::microseconds gap, int wanted_unflagged) {
  TempDir dir;
  auto rec = Recorder::create(dir.path, 0);
  auto slot = rec->add_group("world", 0, 2);
  auto reader = RecordReader::open(rec->path());
  std::atomic<bool> stop{false};
  // Invariant of every write: bytes == 8 * seq, op names the parity of seq.
  std::thread writer([&] {
    for (std::uint64_t seq = 1; !stop.load(std::memory_order_relaxed); ++seq) {
      slot.enter(seq % 2 ? "odd_op_name_xxxxxxxxxx" : "even", seq, 8 * seq);
      if (seq % 3) slot.complete(seq);
      if (gap.count() > 0) std::this_thread::sleep_for(gap);
    }
  });
  RaceCounts c;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  const int wanted_each_state = wanted_unflagged / 10;
  while ((c.unflagged < wanted_unflagged || c.inside < wanted_each_state || c.outside < wanted_each_state) &&
         std::chrono::steady_clock::now() < deadline) {
    const auto v = reader->read();
    ++c.reads;
    const auto& g = v.groups.at(0);
    if (v.torn) {
      ++c.torn;
      continue;
    }
    if (g.seq == 0) continue;
    ++c.unflagged;
    if (g.bytes != 8 * g.seq) ++c.bad;
    if (g.op != (g.seq % 2 ? "odd_op_name_xxxxxxxxxx" : "even")) ++c.bad;
    if (g.in_collective && g.completed_seq >= g.seq) ++c.bad;
    c.inside += g.in_collective;
    c.outside += !g.in_collective;
  }
  stop = true;
  writer.join();
  INFO("gap " << gap.count() << " us: " << c.reads << " reads, " << c.unflagged << " unflagged, " << c.inside
              << " inside a collective, " << c.outside << " outside, " << c.torn << " flagged torn");
  CHECK(c.unflagged >= wanted_unflagged);
  CHECK(c.inside >= wanted_each_state);
  CHECK(c.outside >= wanted_each_state);
  CHECK(c.bad == 0);
  return c;
}
}  // namespace

TEST_CASE("status record: a reader racing a writer never sees a torn record", "[status][threads]") {
  // A writer that never pauses (back-to-back sections): the worst case for the reader, which may
  // be starved past its give-up time on a loaded machine and then flags the read; what it returns
  // unflagged is never mixed.
  race_reader_and_writer(std::chrono::microseconds(0), 200);
  // A writer that rests between collectives, as a rank does (it computes, or waits on its peers):
  // a torn flag is then rare, whatever the machine's load.
  const RaceCounts usual = race_reader_and_writer(std::chrono::microseconds(50), 300);
  INFO(usual.reads << " reads, " << usual.torn << " flagged torn");
  CHECK(usual.torn * 100 <= usual.reads);
}

TEST_CASE("stack dump: the signal writes the main thread's stack, also when another thread takes it", "[status]") {
  TempDir dir;
  const std::string path = dir.path + "/rank-0.stack";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (!install_stack_dump(path)) ::_exit(3);
    // The main thread blocks it; another thread takes it (raise: thread-directed), and its
    // handler hands it to the main thread with tgkill, where it runs once unblocked.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, kStackSignal);
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread t([set] {
      ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
      ::raise(kStackSignal);
    });
    t.join();
    if (::access(path.c_str(), F_OK) == 0) ::_exit(5);  // written by the other thread: wrong
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    for (int i = 0; i < 200; ++i) {
      if (::access(path.c_str(), F_OK) == 0) ::_exit(0);
      ::usleep(10000);
    }
    ::_exit(4);
  }
  int st = 0;
  REQUIRE(::waitpid(child, &st, 0) == child);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const std::string text = lspawn::test::read_file(path);
  INFO(text);
  CHECK(text.rfind("pid " + std::to_string(child) + " main thread\n", 0) == 0);
  CHECK(text.find(kStackEnd) != std::string::npos);
  CHECK(::access((path + ".tmp").c_str(), F_OK) != 0);  // renamed into place, complete
}

TEST_CASE("stack dump: a program's own handler is left alone", "[status]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(kStackSignal, [](int) {});
    ::_exit(install_stack_dump("/tmp/unused") ? 1 : 0);
  }
  int st = 0;
  REQUIRE(::waitpid(child, &st, 0) == child);
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("status record: a slot left mid-update (its writer died there) reads as torn", "[status]") {
  TempDir dir;
  auto rec = Recorder::create(dir.path, 0);
  auto slot = rec->add_group("world", 0, 2);
  slot.enter("all_reduce", 7, 4);
  // What a writer killed between the two version stores leaves behind: an odd version.
  const int fd = ::open(rec->path().c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(m != MAP_FAILED);
  auto* s = reinterpret_cast<GroupSlot*>(static_cast<char*>(m) + sizeof(FileHeader));
  s->version.fetch_add(1);
  auto v = RecordReader::open(rec->path())->read();
  CHECK(v.torn);
  s->version.fetch_add(1);
  v = RecordReader::open(rec->path())->read();
  CHECK_FALSE(v.torn);
  CHECK(v.groups.at(0).seq == 7);
  ::munmap(m, kFileBytes);
}

TEST_CASE("status record: a Writers::Many slot entered on one thread and completed on another stays whole",
          "[status][threads]") {
  // A c10d backend's op is entered by the thread that issues it and completed on the backend's own
  // thread (runtime/recorded_backend.hpp): two writers of one slot at once. Their sections take
  // turns (the seqlock's compare-and-swap), so a reader never reads a mixed record as whole, and
  // the last completion leaves the slot idle.
  TempDir dir;
  auto rec = Recorder::create(dir.path, 0);
  SlotWriter slot = rec->add_group("world.pg", 0, 2, Writers::Many);
  auto reader = RecordReader::open(rec->path());
  REQUIRE(reader);
  // Names under the slot's 23 characters, so that a whole read's op must be its seq's.
  const char* const kOdd = "all_reduce";
  const char* const kEven = "broadcast_long_name_xx";
  std::atomic<bool> stop{false}, issued_all{false};
  std::atomic<std::uint64_t> entered{0};
  std::thread issuer([&] {
    for (std::uint64_t seq = 1; !stop.load(std::memory_order_relaxed); ++seq) {
      slot.enter(seq % 2 ? kOdd : kEven, seq, 8 * seq);
      entered.store(seq, std::memory_order_release);
    }
  });
  std::thread completer([&] {  // completes each op once it was entered, racing the next enter
    for (std::uint64_t seq = 1;; ++seq) {
      while (entered.load(std::memory_order_acquire) < seq) {
        if (issued_all.load(std::memory_order_acquire) && entered.load(std::memory_order_acquire) < seq) return;
      }
      slot.complete(seq);
    }
  });
  std::uint64_t whole = 0, bad = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (whole < 20000 && std::chrono::steady_clock::now() < deadline) {
    const auto v = reader->read();
    if (v.torn || v.groups.empty() || v.groups[0].seq == 0) continue;
    const auto& g = v.groups[0];
    ++whole;
    if (g.bytes != 8 * g.seq || g.op != (g.seq % 2 ? kOdd : kEven)) ++bad;
    if (g.in_collective && g.completed_seq >= g.seq) ++bad;
  }
  stop = true;
  issuer.join();
  issued_all = true;
  completer.join();
  INFO(whole << " whole reads, " << entered.load() << " ops");
  CHECK(whole >= 20000);
  CHECK(bad == 0);
  const auto last = reader->read();
  REQUIRE_FALSE(last.torn);
  CHECK(last.groups.at(0).completed_seq == entered.load());
  CHECK_FALSE(last.groups.at(0).in_collective);
}

TEST_CASE("start phase: the markers a rank writes, tied to its pid (status/phase.hpp)", "[status][restart]") {
  TempDir dir;
  const int me = static_cast<int>(::getpid());
  CHECK(start_phase(dir.path, 4, me) == StartPhase::Unknown);
  // Outside lspawn (no LSPAWN_STATUS_DIR or RANK) nothing is written.
  ::unsetenv("LSPAWN_STATUS_DIR");
  mark_phase("started");
  CHECK(start_phase(dir.path, 4, me) == StartPhase::Unknown);
  ::setenv("LSPAWN_STATUS_DIR", dir.path.c_str(), 1);
  ::setenv("RANK", "4", 1);
  mark_phase("started");
  CHECK(lspawn::test::read_file(dir.path + "/rank-4.started") == std::to_string(me) + "\n");
  CHECK(start_phase(dir.path, 4, me) == StartPhase::BeforeRendezvous);
  CHECK(start_phase(dir.path, 5, me) == StartPhase::Unknown);      // another rank's
  CHECK(start_phase(dir.path, 4, me + 1) == StartPhase::Unknown);  // another process's (an older attempt's)
  mark_phase("rendezvous");
  CHECK(start_phase(dir.path, 4, me) == StartPhase::Rendezvous);
  // A bad RANK writes nothing.
  ::setenv("RANK", "x", 1);
  mark_phase("started");
  CHECK(start_phase(dir.path, 4, me) == StartPhase::Rendezvous);
  ::unsetenv("RANK");
  ::unsetenv("LSPAWN_STATUS_DIR");
}
