// Collectives across real processes: every op against a local reference for N = 1..4 on each
// backend, object collectives, subgroups, and the failure paths (timeout with a missing rank, a
// rank SIGKILLed mid-collective, mismatched calls). The ranks are tests/collectives/worker.cpp.
#include "tests/collectives/ranks.hpp"
#include "tests/collectives/worker.hpp"
#include "support/gpu.hpp"

#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>

using lspawn::test::machine_has_nvidia_gpu;
using lspawn::test::require_all_ok;
using lspawn::test::run_ranks;
using lspawn::test::RunResult;

namespace {
// The worker run_ranks() starts: forked from this process, which links worker.cpp, or exec'd where
// it cannot fork (CMake gives the program's path).
const lspawn::test::Worker kWorker{LSPAWN_COLLECTIVES_TEST_WORKER, &lspawn::test::collectives_worker_main};
}  // namespace

TEST_CASE("every op matches a local reference on gloo and shm for N = 1 to 4", "[collectives][processes]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm");
  for (int n = 1; n <= 4; ++n) {
    std::map<std::string, std::string> env;
    // One 64 MiB all_reduce per backend, at the odd world size.
    if (n == 3) env["LSPAWN_TEST_BIG"] = "1";
    env["LSPAWN_TEST_EXPECT_BACKEND"] = (backend == "shm" && n > 1) ? "shm+gloo" : "gloo";
    auto r = run_ranks(kWorker, n, "suite", backend, env);
    INFO("backend " << backend << ", N=" << n);
    require_all_ok(r);
  }
}

TEST_CASE("shm single copy, when asked for (LSPAWN_SHM_SINGLE_COPY=1), matches the reference across processes",
          "[collectives][processes]") {
  // Off by default (the staged path is faster where measured); this keeps the cross-memory
  // attach path (process_vm_readv/writev between real processes) tested, 64 MiB case included.
  for (int n : {2, 3}) {
    INFO("N=" << n);
    require_all_ok(run_ranks(kWorker, n, "suite", "shm",
                             {{"LSPAWN_SHM_SINGLE_COPY", "1"},
                              {"LSPAWN_TEST_BIG", n == 3 ? "1" : "0"},
                              {"LSPAWN_TEST_EXPECT_BACKEND", "shm+gloo"},
                              {"LSPAWN_TEST_EXPECT_SINGLE_COPY", "1"}}));
  }
}

TEST_CASE(
    "shm with tensors on the device: CUDA IPC device to device, or staged (LSPAWN_SHM_CUDA_IPC=0), CPU without a GPU",
    "[collectives][processes][cuda]") {
  // On a machine with a GPU the ranks share it (N = 2 and 3 on one device) and go through CUDA
  // IPC, or through pinned host memory with LSPAWN_SHM_CUDA_IPC=0; without one the same checks
  // run on CPU tensors.
  // IPC for every size (LSPAWN_SHM_CUDA_IPC_MIN_BYTES=0: every type and op through it), IPC from its
  // default 2 MiB on (small ones staged, in the same group), and staged only. Without a GPU the
  // three modes are one path (CPU tensors never reach CUDA IPC), so it runs once, in the default
  // mode: the variables' parsing has its own case below.
  std::vector<std::pair<const char*, const char*>> modes = {{"1", "0"}, {"1", ""}, {"0", ""}};
  if (!machine_has_nvidia_gpu()) modes = {{"1", ""}};
  for (const auto& [ipc, min_bytes] : modes)
    for (int n : {2, 3}) {
      INFO("N=" << n << ", LSPAWN_SHM_CUDA_IPC=" << ipc << ", LSPAWN_SHM_CUDA_IPC_MIN_BYTES=" << min_bytes);
      auto r = run_ranks(kWorker, n, "device", "shm",
                         {{"LSPAWN_SHM_CUDA_IPC", ipc},
                          {"LSPAWN_SHM_CUDA_IPC_MIN_BYTES", min_bytes},
                          {"LSPAWN_TEST_EXPECT_BACKEND", "shm+gloo"}},
                         std::chrono::seconds(180));
      require_all_ok(r);
      for (const auto& rank : r.ranks) {
        if (!machine_has_nvidia_gpu()) {
          CHECK_THAT(rank.output, Catch::Contains("device cpu, cuda ipc"));
        } else if (std::string(ipc) == "1") {
          CHECK_THAT(rank.output, Catch::Contains("device cuda:0, cuda ipc on"));
        } else {
          CHECK_THAT(rank.output, Catch::Contains("device cuda:0, cuda ipc absent"));
        }
      }
    }
}

TEST_CASE("a bad LSPAWN_SHM_CUDA_IPC or LSPAWN_SHM_CUDA_IPC_MIN_BYTES fails group creation naming it",
          "[collectives][processes][failure]") {
  auto r = run_ranks(kWorker, 2, "sum", "shm", {{"LSPAWN_SHM_CUDA_IPC", "yes"}}, std::chrono::seconds(60));
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
#ifdef LSPAWN_TEST_CUDA_IPC_BUILT
  for (int q : {0, 1}) {
    CHECK(r.ranks[q].exit_code != 0);
    CHECK_THAT(r.ranks[q].output, Catch::Contains("LSPAWN_SHM_CUDA_IPC='yes': expected 1"));
  }
  auto m = run_ranks(kWorker, 2, "sum", "shm", {{"LSPAWN_SHM_CUDA_IPC_MIN_BYTES", "2M"}}, std::chrono::seconds(60));
  INFO(m.all_output());
  REQUIRE_FALSE(m.timed_out);
  for (int q : {0, 1}) {
    CHECK(m.ranks[q].exit_code != 0);
    CHECK_THAT(m.ranks[q].output, Catch::Contains("LSPAWN_SHM_CUDA_IPC_MIN_BYTES='2M': expected a byte count"));
  }
#else
  // A LibTorch without CUDA has no CUDA IPC: the variable is not read.
  for (int q : {0, 1}) CHECK(r.ranks[q].exit_code == 0);
#endif
}

TEST_CASE("a bad LSPAWN_SHM_SINGLE_COPY fails every rank naming it", "[collectives][processes][failure]") {
  auto r = run_ranks(kWorker, 2, "suite", "shm", {{"LSPAWN_SHM_SINGLE_COPY", "yes"}}, std::chrono::seconds(60));
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
  for (int q : {0, 1}) {
    CHECK(r.ranks[q].exit_code != 0);
    CHECK_THAT(r.ranks[q].output, Catch::Contains("LSPAWN_SHM_SINGLE_COPY='yes': expected 1 (on) or 0 (off)"));
  }
}

// Created on a store of its own (Group::create, no init_process_group()), a group still makes a
// peer's death an error rather than a SIGPIPE: seen on 2.4.1 in a clean-clone CI run, where the
// leader of a hierarchical group died of SIGPIPE writing to the killed leader of the other node.
TEST_CASE("a group created without init_process_group ignores SIGPIPE: a gone peer is EPIPE",
          "[collectives][processes]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm", "auto");
  INFO("backend " << backend);
  auto r = run_ranks(kWorker, 2, "sigpipe", backend, {});
  require_all_ok(r);
  for (const auto& rank : r.ranks) CHECK_THAT(rank.output, Catch::Contains("a write to a gone peer is EPIPE"));
}

TEST_CASE("auto picks shm for ranks of one node", "[collectives][processes]") {
  // ... with the staged path: single copy is off unless asked for.
  auto r = run_ranks(kWorker, 2, "objects", "auto",
                     {{"LSPAWN_TEST_EXPECT_BACKEND", "shm+gloo"}, {"LSPAWN_TEST_EXPECT_SINGLE_COPY", "0"}});
  require_all_ok(r);
}

TEST_CASE("object collectives and strategy calls", "[collectives][processes]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm");
  for (int n : {1, 3}) {
    INFO("backend " << backend << ", N=" << n);
    require_all_ok(run_ranks(kWorker, n, "objects", backend));
  }
}

TEST_CASE("subgroups run in their own namespace", "[collectives][processes]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm");
  INFO("backend " << backend);
  require_all_ok(run_ranks(kWorker, 4, "subgroups", backend));
}

TEST_CASE("a rank that never joins makes the others time out naming it", "[collectives][processes][failure]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm");
  auto r = run_ranks(kWorker, 3, "timeout", backend, {{"LSPAWN_TEST_TIMEOUT_MS", "1000"}}, std::chrono::seconds(60));
  INFO("backend " << backend << "\n" << r.all_output());
  REQUIRE_FALSE(r.timed_out);
  for (int q : {0, 1}) {
    CHECK(r.ranks[q].exit_code == 3);  // CollectiveTimeout
    CHECK_THAT(r.ranks[q].output, Catch::Contains("all_reduce") && Catch::Contains("group 'world'"));
    CHECK_THAT(r.ranks[q].output, Catch::Contains(": 2") || Catch::Contains("rank 2 ("));
  }
  CHECK(r.ranks[2].exit_code == 0);
  // 1 s timeout, up to 3 s asking the store who is missing, process start-up: generous bound.
  CHECK(r.seconds < 30);
}

TEST_CASE("a rank SIGKILLed mid-collective makes the others fail within the timeout",
          "[collectives][processes][failure]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm");
  auto r = run_ranks(kWorker, 3, "kill", backend, {{"LSPAWN_TEST_TIMEOUT_MS", "10000"}}, std::chrono::seconds(60));
  INFO("backend " << backend << "\n" << r.all_output());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.ranks[2].signal == SIGKILL);
  for (int q : {0, 1}) {
    CHECK((r.ranks[q].exit_code == 2 || r.ranks[q].exit_code == 3));
    CHECK_THAT(r.ranks[q].output, Catch::Contains("all_reduce"));
  }
  if (backend == "shm") {
    // The shm path sees the peer die (pid check) instead of waiting for the timeout.
    for (int q : {0, 1}) CHECK_THAT(r.ranks[q].output, Catch::Contains("peer died") && Catch::Contains("rank 2"));
  }
  CHECK(r.seconds < 40);
}

TEST_CASE("mismatched calls fail with CollectiveMismatch naming the ranks", "[collectives][processes][failure]") {
  const std::string backend = GENERATE(as<std::string>{}, "gloo", "shm");
  const std::string scenario = GENERATE(as<std::string>{}, "mismatch_op", "mismatch_shape");
  // gloo detects it in checked mode; shm always.
  auto r =
      run_ranks(kWorker, 3, scenario, backend,
                {{"LSPAWN_COLLECTIVES_CHECKED", "1"}, {"LSPAWN_TEST_TIMEOUT_MS", "20000"}}, std::chrono::seconds(60));
  INFO("backend " << backend << ", " << scenario << "\n" << r.all_output());
  REQUIRE_FALSE(r.timed_out);
  for (int q = 0; q < 3; ++q) {
    CHECK(r.ranks[q].exit_code == 4);
    CHECK_THAT(r.ranks[q].output, Catch::Contains("mismatch") && Catch::Contains("rank 1 called"));
  }
}

TEST_CASE("backend nccl without NCCL built in fails at creation with a clear message",
          "[collectives][processes][failure]") {
  auto r = run_ranks(kWorker, 1, "suite", "nccl", {}, std::chrono::seconds(60));
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
  if (r.ranks[0].exit_code == 2) {
    // Without NCCL built in; or built in (LibTorch 2.x CUDA build) on a machine without a GPU.
    CHECK_THAT(r.ranks[0].output, Catch::Contains("backend nccl is not built in") ||
                                      Catch::Contains("backend nccl needs a CUDA device, but none is visible"));
  } else {
    // A CUDA build with NCCL on a GPU machine: the group exists; the CPU suite is not meant for it.
    CHECK(r.ranks[0].signal == 0);
  }
}

// Groups spanning nodes, faked on this machine (LSPAWN_TEST_NODES: LSPAWN_NODE_ID and the env
// contract per rank): 2 nodes x 2 in rank order, interleaved nodes (non-contiguous members), and
// 2 + 1 (uneven nodes: the all_gather blocks are padded).
TEST_CASE("hierarchical: every op matches a local reference across (faked) nodes",
          "[collectives][processes][hierarchical]") {
  const std::string nodes = GENERATE(as<std::string>{}, "0,0,1,1", "0,1,0,1", "0,0,1");
  const int n = static_cast<int>(std::count(nodes.begin(), nodes.end(), ',')) + 1;
  auto r = run_ranks(kWorker, n, "suite", "auto",
                     {{"LSPAWN_TEST_NODES", nodes}, {"LSPAWN_TEST_EXPECT_BACKEND", "hierarchical"}});
  INFO("nodes " << nodes);
  require_all_ok(r);
}

TEST_CASE("hierarchical: LSPAWN_BACKEND=gloo keeps flat gloo, and so does one member per node",
          "[collectives][processes][hierarchical]") {
  INFO("backend gloo on 2 x 2");
  require_all_ok(
      run_ranks(kWorker, 4, "sum", "gloo", {{"LSPAWN_TEST_NODES", "0,0,1,1"}, {"LSPAWN_TEST_EXPECT_BACKEND", "gloo"}}));
  INFO("auto on 1 + 1");
  require_all_ok(
      run_ranks(kWorker, 2, "sum", "auto", {{"LSPAWN_TEST_NODES", "0,1"}, {"LSPAWN_TEST_EXPECT_BACKEND", "gloo"}}));
}

// 4 ranks as 2 nodes of 2 (hierarchical), `victim` SIGKILLed in a kill scenario of worker.cpp; the
// group's timeout is 120 s, which none of these tests may wait for.
RunResult kill_across_nodes(const std::string& scenario, int victim) {
  return run_ranks(kWorker, 4, scenario, "auto",
                   {{"LSPAWN_TEST_NODES", "0,0,1,1"},
                    {"LSPAWN_TEST_KILL_RANK", std::to_string(victim)},
                    {"LSPAWN_TEST_TIMEOUT_MS", "120000"}},
                   std::chrono::seconds(180));
}

// Rank 3 (a member) or rank 2 (its node's leader) is SIGKILLed in an all_reduce: every other rank
// fails in bounded time naming it, also rank 0 and 1 on the other node, whose own view is a
// closed gloo connection or their leader leaving.
TEST_CASE("hierarchical: a rank SIGKILLed mid-collective is named on every node",
          "[collectives][processes][hierarchical][failure]") {
  const int victim = GENERATE(3, 2);
  auto r = kill_across_nodes("kill", victim);
  INFO("victim " << victim << "\n" << r.all_output());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.ranks[victim].signal == SIGKILL);
  const std::string died = "rank " + std::to_string(victim) + " died";
  for (int q = 0; q < 4; ++q) {
    if (q == victim) continue;
    CHECK(r.ranks[q].exit_code == 2);
    CHECK_THAT(r.ranks[q].output,
               Catch::Contains("all_reduce") && Catch::Contains("ranks concerned: " + std::to_string(victim)));
    // Its node-mate saw it die itself; the others read the note it left.
    if (q == (victim ^ 1))
      CHECK_THAT(r.ranks[q].output, Catch::Contains("peer died during the collective: rank " + std::to_string(victim)));
    else
      CHECK_THAT(r.ranks[q].output, Catch::Contains("first failure in the group: " + died));
  }
  // Far below the 120 s timeout: nobody waited for it (however slow the machine starts 4 ranks).
  CHECK(r.seconds < 60);
}

// The same, and every rank that survives catches its failure and stays alive 12 s (a trainer that
// recovers): each still fails within seconds, naming rank 3. Before, rank 0 waited in the
// leaders' gloo step until rank 2, the other leader, exited, and rank 1 on rank 0.
TEST_CASE("hierarchical: ranks that catch the failure and live on do not hold up the others",
          "[collectives][processes][hierarchical][failure]") {
  auto r = kill_across_nodes("kill_stay", 3);
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.ranks[3].signal == SIGKILL);
  for (int q = 0; q < 3; ++q) {
    INFO("rank " << q);
    CHECK(r.ranks[q].exit_code == 2);
    const std::string& out = r.ranks[q].output;
    const auto at = out.find("failed after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(out.substr(at + 13)) < 10.0);  // the 12 s its peers stay alive, or the 120 s timeout
    CHECK_THAT(out, Catch::Contains("ranks concerned: 3"));
  }
  CHECK_THAT(r.ranks[1].output, Catch::Contains("alive) left the group after a failure of its own"));
}

// After that failure a hierarchical group is broken: the next op throws the first failure at
// once on every surviving rank (collectives/hierarchy.hpp, check_usable), naming the same rank,
// instead of a node leader meeting its member mid-op (a collective mismatch, or a wait).
TEST_CASE("hierarchical: after a failed op the next one throws the first failure again",
          "[collectives][processes][hierarchical][failure]") {
  auto r = kill_across_nodes("kill_retry", 3);
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.ranks[3].signal == SIGKILL);
  for (int q = 0; q < 3; ++q) {
    CHECK(r.ranks[q].exit_code == 2);
    CHECK_THAT(r.ranks[q].output, Catch::Contains("first failure: ") &&
                                      Catch::Contains("unusable after an earlier failure") &&
                                      Catch::Contains("ranks concerned: 3"));
    CHECK_THAT(r.ranks[q].output, !Catch::Contains("CollectiveMismatch"));
  }
  CHECK(r.seconds < 60);
}
