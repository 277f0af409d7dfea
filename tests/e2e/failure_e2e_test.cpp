// Fail fast: the root cause, its exit status, the summary, and what happens to the others.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace lspawn::test;

TEST_CASE("exit code 3 of rank 1 is lspawn's exit code - the others are terminated by lspawn", "[e2e][failure]") {
  TempDir sync;
  auto r = run_lspawn({"--nprocs", "4", worker_bin(), "exit-rank", "1", "3"}, {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  INFO(r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("lspawn: root cause: process 1 terminated with exit code 3\n") != std::string::npos);
  // Root cause first, then the workers lspawn stopped.
  const auto root = r.err.find("root cause");
  for (int k : {0, 2, 3}) {
    const auto p = r.err.find("process " + std::to_string(k) + " (pid ");
    CHECK(p != std::string::npos);
    CHECK(p > root);
  }
  CHECK(count(r.err, "terminated by lspawn with SIGTERM") == 3);
  CHECK(r.seconds < 15.0);  // the others wait forever unless lspawn stops them (the harness gives up at 20 s)
}

TEST_CASE("a rank killed by SIGKILL: 137 and the signal name", "[e2e][failure]") {
  auto r = run_lspawn({"--nprocs", "2", worker_bin(), "signal-rank", "1", "9"});
  CHECK(r.exit_code == 137);
  CHECK(r.err.find("root cause: process 1 terminated with signal SIGKILL") != std::string::npos);
}

TEST_CASE("a crashed rank (SIGSEGV): 139 and the signal name", "[e2e][failure]") {
  auto r = run_lspawn({"--nprocs", "2", worker_bin(), "signal-rank", "0", "11"});
  CHECK(r.exit_code == 139);
  CHECK(r.err.find("root cause: process 0 terminated with signal SIGSEGV") != std::string::npos);
}

TEST_CASE("a rank that ignores SIGTERM gets SIGKILL after the grace period", "[e2e][failure][exec-only]") {
  // Rank 0 fails once rank 1 has installed its SIG_IGN.
  TempDir sync;
  auto r = run_lspawn({"--nprocs", "2", "--grace-period", "0.3", "/bin/sh", "-c",
                       "if [ $RANK = 1 ]; then exec " + worker_bin() +
                           " ignore-term; fi; until [ -e $LSPAWN_TEST_SYNC_DIR/ready-1 ]; do sleep 0.01; done; exit 5"},
                      {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  INFO(r.err);
  CHECK(r.exit_code == 5);
  CHECK(r.err.find("root cause: process 0 terminated with exit code 5") != std::string::npos);
  CHECK(r.err.find("grace period of 0.3 s is over") != std::string::npos);
  CHECK(r.err.find("process 1 (pid ") != std::string::npos);
  CHECK(r.err.find("terminated by lspawn with SIGKILL") != std::string::npos);
  CHECK(r.seconds < 15.0);  // the others wait forever unless lspawn stops them (the harness gives up at 20 s)
}

TEST_CASE("the default grace period is torchrun's 30 s, and workers that exit on SIGTERM end the job at once",
          "[e2e][failure]") {
  // Ranks 1 and 2 wait with SIGTERM's default action once rank 0 has failed (after both are
  // ready: the sync directory): nothing waits for the 30 s.
  TempDir sync;
  auto r = run_lspawn({"--nprocs", "3", worker_bin(), "exit-rank", "0", "6"}, {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  INFO(r.err);
  CHECK(r.exit_code == 6);
  CHECK(r.err.find("(SIGKILL after a grace period of 30 s)") != std::string::npos);
  CHECK(r.seconds < 10.0);
}

TEST_CASE("a sibling that exits by itself within the grace period is not reported as killed",
          "[e2e][failure][exec-only]") {
  TempDir sync;
  auto r =
      run_lspawn({"--nprocs", "2", "--grace-period", "60", "/bin/sh", "-c",
                  "if [ $RANK = 1 ]; then exec " + worker_bin() +
                      " exit-on-term; fi; until [ -e $LSPAWN_TEST_SYNC_DIR/ready-1 ]; do sleep 0.01; done; exit 4"},
                 {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  INFO(r.err);
  CHECK(r.exit_code == 4);
  CHECK(r.out.find("[rank 1] got SIGTERM") != std::string::npos);
  CHECK(r.err.find("process 1 (pid ") != std::string::npos);
  CHECK(r.err.find("exited with code 0") != std::string::npos);
  CHECK(r.err.find("terminated by lspawn") == std::string::npos);
  CHECK(r.seconds < 15.0);  // did not wait for the 60 s grace period (the harness gives up at 20 s)
}

TEST_CASE("a worker that exits 0 early does not stop the others", "[e2e][failure][exec-only]") {
  auto r = run_lspawn(
      {"--nprocs", "3", "--quiet", "/bin/sh", "-c", "if [ $RANK = 0 ]; then exit 0; fi; sleep 0.3; echo done-$RANK"});
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "done-") == 2);
  CHECK(r.err.empty());
}

TEST_CASE("an ErrorReport written by the failing rank is in the summary", "[e2e][failure]") {
  auto r = run_lspawn({"--nprocs", "3", worker_bin(), "report-rank", "2"});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("root cause: process 2 terminated with exit code 1") != std::string::npos);
  CHECK(r.err.find("error: std::runtime_error: fixture boom") != std::string::npos);
  CHECK(r.err.find("lspawn:     frame_one\nlspawn:     frame_two\n") != std::string::npos);
  CHECK(r.err.find("reported from host fixture-host") != std::string::npos);
}

TEST_CASE("the root cause is the earliest failure - not the first exit", "[e2e][failure][exec-only]") {
  // Rank 1 raises first (its report carries the throw time) but is still unwinding when rank 0,
  // failing because of it, exits first: rank 1 is the root cause, lspawn exits 1.
  TempDir sync;
  auto r = run_lspawn(
      {"--nprocs", "2", "/bin/sh", "-c",
       "if [ $RANK = 1 ]; then exec " + worker_bin() +
           " report-then-wait 1; fi; until [ -e $LSPAWN_TEST_SYNC_DIR/ready-1 ]; do sleep 0.01; done; exit 3"},
      {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("root cause: process 1 raised std::runtime_error and was stopped by lspawn with "
                   "SIGTERM while exiting") != std::string::npos);
  CHECK(r.err.find("error: std::runtime_error: first failure") != std::string::npos);
  CHECK(r.err.find("also process 0 terminated with exit code 3") != std::string::npos);
}

TEST_CASE("a torchrun-format error file (Python @record) is in the summary too", "[e2e][failure]") {
  auto r = run_lspawn({"--nprocs", "2", worker_bin(), "torchrun-report-rank", "0"});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("error: ValueError: python boom") != std::string::npos);
  CHECK(r.err.find("lspawn:     Traceback (most recent call last):") != std::string::npos);
}

TEST_CASE("a failure without an error file says none was written", "[e2e][failure][exec-only]") {
  auto r = run_lspawn({"/bin/sh", "-c", "exit 7"});
  CHECK(r.exit_code == 7);
  CHECK(r.err.find("error file: none written") != std::string::npos);
}
