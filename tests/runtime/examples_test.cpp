// The examples, run as real jobs: hello_allreduce under a hand-set env contract and under
// torchrun (scripts/torchrun.py), and examples/ddp_python.py (unmodified PyTorch) under the same
// env contract lspawn gives, on a port reserved the way lspawn reserves it.
#include <chrono>
#include <vector>

#include <unistd.h>

#include "proto/wire.hpp"
#include "runtime/error_report.hpp"
#include "runtime/torch_compat.hpp"
#include "support/child.hpp"
#include "support/ports.hpp"
#include "support/ranks.hpp"
#include "support/temp_dir.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using lspawn::test::ChildProcess;
using lspawn::test::ReservedPort;
using lspawn::test::TempDir;

#ifdef LSPAWN_HELLO_ALLREDUCE

namespace {

// The Python whose torch is of the LibTorch line under test (CMake: LSPAWN_TEST_PYTHON):
// Debian's /usr/bin/python3 (torch 1.13) or the torch 2.x venv of scripts/setup-torch2.sh.
const char* kPython = LSPAWN_TEST_PYTHON;

bool python_has_torch() {
  static const bool has = [] {
    if (::access(kPython, X_OK) != 0) return false;
    TempDir dir;
    ChildProcess c({kPython, "-c", "import torch.distributed"}, {}, dir.file("out"));
    return c.wait_or_kill(60s).code == 0;
  }();
  return has;
}

// "2.4" of "2.4.1+cu121": the release line, which fixes the store's wire protocol.
std::string major_minor(const std::string& version) {
  const auto dot = version.find('.');
  const auto end = dot == std::string::npos ? dot : version.find_first_not_of("0123456789", dot + 1);
  return version.substr(0, end);
}

// The Python's torch is of this LibTorch's release line: a C++ worker can then be a client of its
// torchrun's agent store (the store protocol changed at 2.1: a VALIDATE handshake). The 2.4 line
// has no Python torch of its own here (its wheel needs CUDA 12's libraries to import) and runs
// the Python cases with Debian's 1.13.
bool python_torch_matches() {
  static const bool same = [] {
    TempDir dir;
    ChildProcess c({kPython, "-c", "import torch; print(torch.__version__)"}, {}, dir.file("out"));
    if (c.wait_or_kill(60s).code != 0) return false;
    return major_minor(c.output()) == major_minor(lspawn::compat::torch_version());
  }();
  return same;
}

std::vector<ChildProcess> start_job(const std::vector<std::string>& argv, int n, uint16_t port, const TempDir& dir,
                                    std::map<std::string, std::string> extra = {}) {
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < n; ++r) {
    auto env = lspawn::test::contract_env(r, n, port, "examples");
    env["LSPAWN_RDZV_TIMEOUT"] = "60";
    env["LSPAWN_PG_TIMEOUT"] = "60";
    for (const auto& [k, v] : extra) env[k] = v;
    if (env.count("TORCHELASTIC_ERROR_FILE")) env["TORCHELASTIC_ERROR_FILE"] += std::to_string(r);
    ranks.emplace_back(argv, env, dir.file("rank" + std::to_string(r)));
  }
  return ranks;
}

}  // namespace

TEST_CASE("hello_allreduce: 2 ranks all-reduce, broadcast, all-gather and exit 0", "[examples]") {
  TempDir dir;
  ReservedPort reserved;
  auto ranks = start_job({LSPAWN_HELLO_ALLREDUCE, "--size", "1000", "--iters", "3"}, 2, reserved.port(), dir);
  for (int r = 0; r < 2; ++r) {
    const auto st = ranks[r].wait_or_kill(60s);
    INFO("rank " << r << ": " << st.describe() << "\n" << ranks[r].output());
    CHECK(st.code == 0);
    CHECK_THAT(ranks[r].output(), Contains("rank " + std::to_string(r) + "/2: allreduce sum = 3"));
  }
  CHECK_THAT(ranks[0].output(), Contains("broadcast, all_gather, barrier ok"));
}

TEST_CASE("hello_allreduce: --throw-rank writes an error report - the peer fails instead of hanging", "[examples]") {
  TempDir dir;
  ReservedPort reserved;
  auto ranks = start_job({LSPAWN_HELLO_ALLREDUCE, "--throw-rank", "1"}, 2, reserved.port(), dir,
                         {{"TORCHELASTIC_ERROR_FILE", dir.file("error")}});
  const auto st1 = ranks[1].wait_or_kill(60s);
  INFO("rank 1: " << st1.describe() << "\n" << ranks[1].output());
  CHECK(st1.code == 1);
  CHECK_THAT(ranks[1].output(), Contains("[lspawn] rank 1: uncaught std::runtime_error: rank 1 throws on purpose"));
  lspawn::proto::ErrorReport report;
  lspawn::wire::read_json_file(dir.file("error1"), report);
  CHECK(report.rank == 1);
  CHECK(report.message == "rank 1 throws on purpose");
  // Rank 0 was in all_reduce with rank 1: gloo sees the closed connection and rank 0 fails too.
  const auto st0 = ranks[0].wait_or_kill(60s);
  INFO("rank 0: " << st0.describe() << "\n" << ranks[0].output());
  CHECK_FALSE(st0.timed_out);
  CHECK(st0.code == 1);
}

TEST_CASE("hello_allreduce: --fail-rank exits with the requested code", "[examples]") {
  TempDir dir;
  ChildProcess c({LSPAWN_HELLO_ALLREDUCE, "--fail-rank", "0", "--exit-code", "7"}, lspawn::test::contract_env(0, 1, 0),
                 dir.file("out"));
  const auto st = c.wait_or_kill(60s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 7);
  CHECK_THAT(c.output(), Contains("rank 0: failing on purpose with exit code 7"));
}

TEST_CASE("hello_allreduce: a bad environment is reported with the variable's name", "[examples]") {
  TempDir dir;
  auto env = lspawn::test::contract_env(0, 2, 1);
  env["RANK"] = "x";
  ChildProcess c({LSPAWN_HELLO_ALLREDUCE}, env, dir.file("out"));
  const auto st = c.wait_or_kill(60s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  CHECK_THAT(c.output(), Contains("[lspawn] rank ?: uncaught lspawn::EnvError: RANK='x' is not an integer"));
}

#ifdef LSPAWN_BIN
// The main job of the README: lspawn starting hello_allreduce, by exec and by forkserver (the
// program executed once; its workers forked after LibTorch's loading and static init).
TEST_CASE("lspawn --nprocs 4 hello_allreduce: every rank all-reduces - by exec and by forkserver",
          "[examples][lspawn]") {
  for (const char* method : {"exec", "forkserver"}) {
    TempDir dir;
    ChildProcess c({LSPAWN_BIN, "--start-method", method, "--nprocs", "4", LSPAWN_HELLO_ALLREDUCE, "--size", "1000",
                    "--iters", "3"},
                   {{"LSPAWN_RDZV_TIMEOUT", "60"}, {"LSPAWN_PG_TIMEOUT", "60"}}, dir.file("out"));
    const auto st = c.wait_or_kill(120s);
    INFO(method << ": " << st.describe() << "\n" << c.output());
    CHECK(st.code == 0);
    for (int r = 0; r < 4; ++r) {
      CHECK_THAT(c.output(),
                 Contains("[rank " + std::to_string(r) + "] rank " + std::to_string(r) + "/4: allreduce sum = 10"));
    }
    CHECK_THAT(c.output(), Contains("broadcast, all_gather, barrier ok"));
  }
}

TEST_CASE("lspawn --start-method forkserver: a rank that throws is the root cause with its report",
          "[examples][lspawn]") {
  TempDir dir;
  ChildProcess c({LSPAWN_BIN, "--start-method", "forkserver", "--nprocs", "3", "--grace-period", "2",
                  LSPAWN_HELLO_ALLREDUCE, "--throw-rank", "2"},
                 {{"LSPAWN_RDZV_TIMEOUT", "60"}, {"LSPAWN_PG_TIMEOUT", "60"}}, dir.file("out"));
  const auto st = c.wait_or_kill(120s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  CHECK_THAT(c.output(), Contains("root cause: process 2"));
  CHECK_THAT(c.output(), Contains("std::runtime_error: rank 2 throws on purpose"));
}

// #33: a rank that fails before its rendezvous (before init_process_group(): a bad argument, a
// missing file) fails the same way in every attempt: not restarted, and the report says why. One
// that fails after it is restarted as --max-restarts says.
TEST_CASE("lspawn --max-restarts: a rank failing before init_process_group is not restarted, one failing after it is",
          "[examples][lspawn][restart]") {
  TempDir dir;
  ChildProcess before({LSPAWN_BIN, "--nprocs", "2", "--max-restarts", "2", "--grace-period", "2",
                       LSPAWN_HELLO_ALLREDUCE, "--before-init", "--fail-rank", "1", "--exit-code", "3"},
                      {{"LSPAWN_RDZV_TIMEOUT", "60"}}, dir.file("before"));
  auto st = before.wait_or_kill(120s);
  INFO("before: " << st.describe() << "\n" << before.output());
  CHECK(st.code == 3);
  CHECK_THAT(before.output(), Contains("root cause: process 1 terminated with exit code 3"));
  CHECK_THAT(before.output(), Contains("lspawn:   not restarted (2 restarts left): rank 1 failed before it reached its "
                                       "rendezvous (init_process_group): the next attempt would fail the same way"));
  CHECK_THAT(before.output(), !Contains("restart 1 of 2"));
  // The same exit after init_process_group, on attempt 0 only: restarted, and attempt 1 succeeds.
  ChildProcess after({LSPAWN_BIN, "--nprocs", "2", "--max-restarts", "2", "--grace-period", "2", LSPAWN_HELLO_ALLREDUCE,
                      "--fail-rank", "1", "--exit-code", "3", "--fail-on-attempt", "0"},
                     {{"LSPAWN_RDZV_TIMEOUT", "60"}}, dir.file("after"));
  st = after.wait_or_kill(120s);
  INFO("after: " << st.describe() << "\n" << after.output());
  CHECK(st.code == 0);
  CHECK_THAT(after.output(), Contains("restart 1 of 2"));
  CHECK_THAT(after.output(), !Contains("not restarted"));
  // The end: which attempt failed how.
  CHECK_THAT(after.output(),
             Contains("lspawn: attempts: attempt 0 failed (process 1 terminated with exit code 3 on node "
                      "0 (") &&
                 Contains("); attempt 1 succeeded\n"));
}

// #34, the command of the issue: rank 1 sleeps after init_process_group(), ranks 0 and 2 wait in
// their first World::pg->allreduce (c10d's process group: runtime/recorded_backend.hpp records it).
TEST_CASE("lspawn --hang-timeout 3 hello_allreduce --hang-rank 1: the report names the c10d all_reduce, exit 124",
          "[examples][lspawn][hang]") {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  ChildProcess c({LSPAWN_BIN, "--nprocs", "3", "--hang-timeout", "3", "--grace-period", "2", LSPAWN_HELLO_ALLREDUCE,
                  "--hang-rank", "1", "--iters", "100000"},
                 {}, dir.file("out"));
  const auto st = c.wait_or_kill(90s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(st.describe() << " after " << seconds << " s\n" << c.output());
  CHECK(st.code == 124);
  CHECK_THAT(c.output(), Contains("lspawn: hang: no rank made progress in its collectives for "));
  CHECK_THAT(c.output(), Contains("waiting: ranks 0, 2 in all_reduce #1 on group world.pg, "));
  CHECK_THAT(c.output(), Contains("behind: rank 1 has not entered a collective for "));
  CHECK_THAT(c.output(), Contains("main thread of rank 1 (pid "));
  CHECK_THAT(c.output(), Contains("stopped by the hang watchdog (--hang-timeout)"));
  // --hang-timeout, the watch's poll and stack wait, the grace period: well under the 90 s limit.
  CHECK(seconds < 30);
}
#endif

TEST_CASE("ddp_python.py: an unmodified PyTorch script runs on the env contract and a reserved port",
          "[examples][python]") {
  if (!python_has_torch()) {
    WARN("skipped: " << kPython << " has no torch.distributed");
    return;
  }
  TempDir dir;
  ReservedPort reserved;
  auto ranks =
      start_job({kPython, std::string(LSPAWN_SOURCE_DIR) + "/examples/ddp_python.py"}, 2, reserved.port(), dir);
  for (int r = 0; r < 2; ++r) {
    const auto st = ranks[r].wait_or_kill(120s);
    INFO("rank " << r << ": " << st.describe() << "\n" << ranks[r].output());
    CHECK(st.code == 0);
    CHECK_THAT(ranks[r].output(), Contains("python rank " + std::to_string(r) + "/2 (local " + std::to_string(r) +
                                           "): allreduce sum = 3 ok"));
  }
}

TEST_CASE("lspawn --nprocs 2 python ddp_python.py: an unmodified PyTorch script runs under lspawn",
          "[examples][python][lspawn]") {
  if (!python_has_torch()) {
    WARN("skipped: " << kPython << " has no torch.distributed");
    return;
  }
  TempDir dir;
  ChildProcess c({LSPAWN_BIN, "--nprocs", "2", kPython, std::string(LSPAWN_SOURCE_DIR) + "/examples/ddp_python.py"}, {},
                 dir.file("out"));
  const auto st = c.wait_or_kill(180s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 0);
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(c.output(), Contains("python rank " + std::to_string(r) + "/2 (local " + std::to_string(r) +
                                    "): allreduce sum = 3 ok"));
  }
}

TEST_CASE("scripts/torchrun.py runs hello_allreduce with --no_python (lspawn worker under torchrun)",
          "[examples][python]") {
  if (!python_has_torch()) {
    WARN("skipped: " << kPython << " has no torch.distributed");
    return;
  }
  if (!python_torch_matches()) {
    WARN("skipped: " << kPython << "'s torch is not of LibTorch " << lspawn::compat::torch_version()
                     << "'s release line (the C++ worker is a client of torchrun's store)");
    return;
  }
  TempDir dir;
  ReservedPort reserved;  // torchrun's agent hosts its store here (static rendezvous)
  ChildProcess c({kPython, std::string(LSPAWN_SOURCE_DIR) + "/scripts/torchrun.py", "--nproc_per_node", "2",
                  "--master_addr", "127.0.0.1", "--master_port", std::to_string(reserved.port()), "--max_restarts", "0",
                  "--no_python", LSPAWN_HELLO_ALLREDUCE},
                 // TMPDIR: torchrun's agent leaves its torchelastic_* log directory there.
                 {{"OMP_NUM_THREADS", "1"}, {"LSPAWN_RDZV_TIMEOUT", "60"}, {"TMPDIR", dir.path}}, dir.file("out"));
  const auto st = c.wait_or_kill(180s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 0);
  CHECK_THAT(c.output(), Contains("rank 0/2: allreduce sum = 3"));
  CHECK_THAT(c.output(), Contains("rank 1/2: allreduce sum = 3"));
}

#endif  // LSPAWN_HELLO_ALLREDUCE
