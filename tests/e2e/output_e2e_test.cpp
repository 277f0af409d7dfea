// Worker output on lspawn's console and in --log-dir files.
#include <catch2/catch.hpp>

#include <fstream>
#include <cstdio>
#include <sstream>

#include <signal.h>
#include <unistd.h>

#include "harness.hpp"

using namespace lspawn::test;

TEST_CASE("every line is prefixed with its rank and never interleaved mid-line", "[e2e][output]") {
  const int kLines = 3000;
  auto r = run_lspawn({"--nprocs", "4", "--quiet", worker_bin(), "lines", std::to_string(kLines)});
  REQUIRE(r.exit_code == 0);
  // "[rank R] rR line I <200 x letter>", parsed by hand (std::regex warns under ASan).
  int per_rank[4] = {0, 0, 0, 0};
  int next[4] = {0, 0, 0, 0};
  for (const auto& l : lines(r.out)) {
    int rank = -1, rank2 = -2, idx = -1, used = 0;
    INFO(l.substr(0, 120));
    REQUIRE(std::sscanf(l.c_str(), "[rank %d] r%d line %d %n", &rank, &rank2, &idx, &used) == 3);
    REQUIRE(rank >= 0);
    REQUIRE(rank < 4);
    CHECK(rank2 == rank);
    CHECK(l.substr(static_cast<size_t>(used)) == std::string(200, static_cast<char>('a' + rank)));
    CHECK(idx == next[rank]);  // in order within a rank
    ++next[rank];
    ++per_rank[rank];
  }
  for (int k = 0; k < 4; ++k) CHECK(per_rank[k] == kLines);
  CHECK(r.err.empty());  // --quiet
}

TEST_CASE("option --no-prefix writes lines as they are", "[e2e][output][exec-only]") {
  auto r = run_lspawn({"--nprocs", "2", "--quiet", "--no-prefix", "/bin/echo", "plain"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "plain\nplain\n");
}

TEST_CASE("stderr of a worker goes to lspawn's stderr", "[e2e][output][exec-only]") {
  auto r = run_lspawn({"--quiet", "/bin/sh", "-c", "echo to-out; echo to-err >&2"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "[rank 0] to-out\n");
  CHECK(r.err == "[rank 0] to-err\n");
}

TEST_CASE("a last line without newline is flushed with one added", "[e2e][output]") {
  auto r = run_lspawn({"--quiet", "--nprocs", "2", worker_bin(), "partial"});
  REQUIRE(r.exit_code == 0);
  CHECK(count(r.out, "[rank 0] no newline at end\n") == 1);
  CHECK(count(r.out, "[rank 1] no newline at end\n") == 1);
}

TEST_CASE("the half line of a worker that dies mid-line is not lost", "[e2e][output]") {
  auto r = run_lspawn({"--quiet", worker_bin(), "die-mid-line"});
  CHECK(r.exit_code == 137);
  CHECK(r.out == "[rank 0] half a li\n");
  CHECK(r.err.find("process 0 terminated with signal SIGKILL") != std::string::npos);
}

TEST_CASE("a line longer than 64 KiB arrives whole - in 64 KiB pieces", "[e2e][output]") {
  const size_t kBytes = 200000;
  auto r = run_lspawn({"--quiet", worker_bin(), "long-line", std::to_string(kBytes)});
  REQUIRE(r.exit_code == 0);
  std::string joined;
  for (const auto& l : lines(r.out)) {
    REQUIRE(l.rfind("[rank 0] ", 0) == 0);
    CHECK(l.size() - 9 <= 64 * 1024);
    joined += l.substr(9);
  }
  CHECK(joined == std::string(kBytes, 'x'));
}

TEST_CASE("option --log-dir writes one file per rank and stream - exactly --tee also to the console",
          "[e2e][output][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs/nested";
  const std::vector<std::string> prog = {"/bin/sh", "-c", "echo out-$RANK; printf err-$RANK >&2"};
  std::vector<std::string> args = {"--quiet", "--nprocs", "2", "--log-dir", logs};
  args.insert(args.end(), prog.begin(), prog.end());
  auto r = run_lspawn(args);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());
  CHECK(read_file(logs + "/rank0.stdout") == "out-0\n");
  CHECK(read_file(logs + "/rank1.stdout") == "out-1\n");
  CHECK(read_file(logs + "/rank0.stderr") == "err-0");  // raw bytes: no newline invented
  CHECK(read_file(logs + "/rank1.stderr") == "err-1");

  args = {"--quiet", "--nprocs", "2", "--log-dir=" + logs, "--tee"};
  args.insert(args.end(), prog.begin(), prog.end());
  r = run_lspawn(args);
  REQUIRE(r.exit_code == 0);
  CHECK(count(r.out, "[rank 0] out-0\n") == 1);
  CHECK(count(r.out, "[rank 1] out-1\n") == 1);
  CHECK(count(r.err, "[rank 1] err-1\n") == 1);
  CHECK(read_file(logs + "/rank1.stdout") == "out-1\n");
}

TEST_CASE("option --log-dir with --max-restarts: each attempt writes its own files - a failed attempt's output is kept",
          "[e2e][output][restarts][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  // Rank 1 fails on attempts 0 and 1, explaining why on stderr; attempt 2 succeeds. Rank 1 fails
  // only once rank 0 has written its line (the marker file), or fail-fast could stop rank 0 first.
  auto r = run_lspawn({"--nprocs", "2", "--max-restarts", "2", "--log-dir", logs, "/bin/sh", "-c",
                       "a=$TORCHELASTIC_RESTART_COUNT; echo \"attempt $a rank $RANK\"; touch " + dir.path +
                           "/r$RANK.$a; if [ $RANK = 1 ] && [ $a -lt 2 ]; then while [ ! -e " + dir.path +
                           "/r0.$a ]; do sleep 0.01; done; echo \"why $a\" >&2; exit 3; fi"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(read_file(logs + "/rank0.stdout") == "attempt 0 rank 0\n");
  CHECK(read_file(logs + "/rank1.stdout") == "attempt 0 rank 1\n");
  CHECK(read_file(logs + "/rank1.stderr") == "why 0\n");
  CHECK(read_file(logs + "/rank1.attempt1.stderr") == "why 1\n");
  CHECK(read_file(logs + "/rank0.attempt2.stdout") == "attempt 2 rank 0\n");
  CHECK(read_file(logs + "/rank1.attempt2.stdout") == "attempt 2 rank 1\n");
  CHECK(read_file(logs + "/rank1.attempt2.stderr").empty());
  CHECK(r.err.find("restart 1 of 2: starting 2 workers, log files " + logs + "/rank<N>.attempt1.std{out,err}\n") !=
        std::string::npos);
}

TEST_CASE("option --log-dir that cannot be created: exit 2 and the reason", "[e2e][output][exec-only]") {
  TempDir dir;
  const std::string file = dir.path + "/file";
  std::ofstream(file) << "x";
  auto r = run_lspawn({"--log-dir", file + "/sub", "/bin/true"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--log-dir " + file + "/sub: cannot create it") != std::string::npos);
}

TEST_CASE("a process that left the worker's group and holds its pipes does not hang lspawn",
          "[e2e][output][exec-only]") {
  // setsid: the sleep escapes the worker's process group (so lspawn cannot kill it) and keeps
  // the stdout pipe open; lspawn gives up on the pipes after its drain timeout (2 s), long
  // before the sleep ends.
  auto r = run_lspawn({"/bin/sh", "-c", "setsid sleep 60 & sleep 0.2; echo escaped $!"});
  const auto p = r.out.find("escaped ");
  if (p != std::string::npos) kill(std::stoi(r.out.substr(p + 8)), SIGKILL);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(p != std::string::npos);
  CHECK(r.err.find("output pipes are still open") != std::string::npos);
  CHECK(r.seconds < 15.0);  // 2 s of drain, not the 60 s of the sleep (the harness gives up at 20 s)
}
