// Hang diagnosis end to end (docs/hang-diagnosis.md): the built lspawn with real collectives
// workers (tests/e2e/fixtures/hang_worker.cpp) that hang on purpose; --hang-timeout 1 keeps each
// case to a few seconds. [torch]: the cases whose subject is the collectives' records (the torch
// test set, tests/CMakeLists.txt; run on every LibTorch line).
#include <catch2/catch.hpp>

#include <set>
#include <sstream>
#include <thread>

#include <signal.h>
#include <sys/wait.h>

#include "harness.hpp"
#include "launcher/cli_options.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {}  // namespace

TEST_CASE("hang: a rank that never enters an all_reduce is named, with its stack, exit 124, nothing left",
          "[e2e][hang][torch]") {
  Subreaper reaper;
  Child c(with_start_method({lspawn_bin(), "--nprocs", "3", "--hang-timeout", "1", "--grace-period", "2",
                             hang_worker_bin(), "never-enters", "2", "3"}));
  const int st = c.wait(60s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  const std::string& e = c.err();
  CHECK(count(e, "lspawn: hang: no rank made progress in its collectives for ") == 1);
  CHECK(has(e, "(--hang-timeout 1)"));
  CHECK(has(e, "waiting: ranks 0, 1 in all_reduce #4 on group world, 16 B, for "));
  CHECK(has(e, "(2 of 3 members)"));
  CHECK(has(e, "behind: rank 2 has not entered a collective for "));
  CHECK(has(e, "the others wait in all_reduce #4 on group world"));
  CHECK(has(e, "last completed: all_reduce #3 on group world"));
  CHECK(has(e, "main thread of rank 2 (pid "));
  CHECK(has(e, "lspawn_test::sleep_outside_collectives()"));  // its stack, demangled
  CHECK(has(e, "stopped by the hang watchdog"));
  const auto pids = worker_pids(c.out());
  CHECK(pids.size() == 3);
  CHECK(alive_after(pids, 2s).empty());
}

TEST_CASE("hang: a rank stuck in a subgroup collective its partner never joins: op and sequence numbers",
          "[e2e][hang][torch]") {
  Subreaper reaper;
  Child c(with_start_method({lspawn_bin(), "--nprocs", "3", "--hang-timeout", "1", "--grace-period", "2",
                             hang_worker_bin(), "subgroup", "0", "2"}));
  const int st = c.wait(60s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  const std::string& e = c.err();
  CHECK(has(e, "waiting: ranks 1, 2 in all_reduce #3 on group world, 16 B"));
  CHECK(has(e, "behind: rank 0 still in all_reduce #1 on group world.1, 16 B, for "));
  CHECK(has(e, "(the others wait in all_reduce #3 on group world)"));
  CHECK(has(e, "main thread of rank 0 (pid "));
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

TEST_CASE("hang: the report on demand (SIGURG, lspawn status PID) while the job goes on", "[e2e][hang][torch]") {
  Subreaper reaper;
  Child c(with_start_method(
      {lspawn_bin(), "--nprocs", "2", "--grace-period", "2", hang_worker_bin(), "never-enters", "1", "2"}));
  REQUIRE(c.wait_stdout_count("ready pid", 2, 30s));
  // Rank 0 enters all_reduce #3 right after printing; give it a moment to be inside.
  REQUIRE(c.wait_output([](const std::string&, const std::string&) { return false; }, 300ms) == false);
  c.signal(SIGURG);
  REQUIRE(c.wait_output(
      [](const std::string&, const std::string& e) {
        return e.find("status of 2 ranks (on request)") != std::string::npos &&
               e.find("main thread of rank 1") != std::string::npos;
      },
      10s));
  CHECK(has(c.err(), "waiting: rank 0 in all_reduce #3 on group world"));
  CHECK(has(c.err(), "behind: rank 1 has not entered a collective for "));
  CHECK(alive(c.pid()));  // not stopped, not forwarded

  const auto r = run_lspawn({"status", std::to_string(c.pid())});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "lspawn: status of 2 ranks (on request)"));
  CHECK(has(r.out, "waiting: rank 0 in all_reduce #3 on group world"));
  CHECK(has(r.out, "lspawn_test::sleep_outside_collectives()"));
  CHECK(alive(c.pid()));

  c.signal(SIGTERM);
  const int st = c.wait(20s);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 143);
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

TEST_CASE("hang: ranks computing between collectives longer than --hang-timeout are not a hang",
          "[e2e][hang][exec-only][torch]") {
  const auto r = run_lspawn({"--nprocs", "2", "--hang-timeout", "1", hang_worker_bin(), "slow-steps", "0", "2"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(!has(r.err, "hang:"));
}

TEST_CASE("lspawn status: a pid that is not an lspawn job", "[e2e][hang][exec-only]") {
  const auto r = run_lspawn({"status", "1"});
  CHECK(r.exit_code == 1);
  CHECK(has(r.err, "is not a running lspawn job"));
  const auto u = run_lspawn({"status", "abc"});
  CHECK(u.exit_code == lspawn::exit_codes::kUsage);
}

TEST_CASE("hang: over gloo too (the op is in flight until Work::wait returns)", "[e2e][hang][exec-only][torch]") {
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--hang-timeout", "1", "--grace-period", "2", hang_worker_bin(),
           "never-enters", "1", "2"},
          {"LSPAWN_BACKEND=gloo"});
  const int st = c.wait(60s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  CHECK(has(c.err(), "waiting: rank 0 in all_reduce #3 on group world, 16 B"));
  CHECK(has(c.err(), "behind: rank 1 has not entered a collective for "));
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

// #34: a worker that uses only c10d's ProcessGroup (World::pg), as the README's main job does:
// its collectives enter the status record too (runtime/recorded_backend.hpp), under the slot
// "world.pg"; init_process_group()'s own barrier is not counted.
TEST_CASE("hang: a rank that never enters World::pg->allreduce is named (c10d's process group, no lspawn collective)",
          "[e2e][hang][torch]") {
  Subreaper reaper;
  Child c(with_start_method({lspawn_bin(), "--nprocs", "3", "--hang-timeout", "1", "--grace-period", "2",
                             hang_worker_bin(), "pg-never-enters", "1", "2"}));
  const int st = c.wait(60s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  const std::string& e = c.err();
  CHECK(count(e, "lspawn: hang: no rank made progress in its collectives for ") == 1);
  CHECK(has(e, "waiting: ranks 0, 2 in all_reduce #3 on group world.pg, 16 B, for "));
  CHECK(has(e, "behind: rank 1 has not entered a collective for "));
  CHECK(has(e, "last completed: all_reduce #2 on group world.pg"));
  CHECK(has(e, "lspawn_test::sleep_outside_collectives()"));
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

TEST_CASE("hang: World::pg on demand: lspawn status PID shows the c10d collective while the job goes on",
          "[e2e][hang][exec-only][torch]") {
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--grace-period", "2", hang_worker_bin(), "pg-never-enters", "1", "1"});
  REQUIRE(c.wait_stdout_count("ready pid", 2, 30s));
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {  // rank 0 enters all_reduce #2 right after printing
    out = run_lspawn({"status", std::to_string(c.pid())}).out;
    if (has(out, "waiting: rank 0 in all_reduce #2 on group world.pg")) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(out);
  CHECK(has(out, "waiting: rank 0 in all_reduce #2 on group world.pg"));
  CHECK(has(out, "behind: rank 1 has not entered a collective for "));
  c.signal(SIGTERM);
  const int st = c.wait(20s);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 143);
}

// #34: a rank that writes no status record while the others have is named, once, instead of the
// watch waiting in silence (it cannot see that rank).
TEST_CASE("hang watch: a rank with no status record 5 s after the others is named once", "[e2e][hang][exec-only]") {
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "3", "--hang-timeout", "1", "--grace-period", "2", "--rdzv-timeout", "60",
           hang_worker_bin(), "no-init", "2", "1"});
  REQUIRE(c.wait_output(
      [](const std::string&, const std::string& e) {
        return e.find("lspawn: hang watch: rank 2 has written no status record ") != std::string::npos;
      },
      30s));
  const std::string& e = c.err();
  CHECK(has(e, " after the first rank did, so --hang-timeout cannot see it: such ranks run neither lspawn's runtime"));
  CHECK(!has(e, "lspawn: hang: no rank made progress"));  // nobody is in a collective: not a hang
  c.signal(SIGTERM);
  const int st = c.wait(30s);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 143);
  CHECK(count(c.err(), "lspawn: hang watch: rank 2 has written no status record") == 1);
}
