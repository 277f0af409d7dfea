// Strategies across real processes: DDP / XLA equivalence with one process, no_sync, the
// Lightning collective calls on gloo and shm, checkpoint + resume, a failing rank under the
// lspawn CLI, DDPSpawn / XLASpawn from a caller, and the digits example.
#include "tests/collectives/ranks.hpp"
#include "tests/strategies/worker.hpp"
#include "support/child.hpp"
#include "support/gpu.hpp"
#include "support/temp_dir.hpp"

#include <chrono>
#include <map>
#include <unistd.h>
#include <string>

// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using lspawn::test::machine_has_nvidia_gpu;
using lspawn::test::require_all_ok;
using lspawn::test::run_ranks;

namespace {
// The worker run_ranks() starts: forked from this process (it links worker.cpp), or exec'd (CMake
// gives its path). The scenario "spawn" always execs the program: its lspawn::spawn() may start
// /proc/self/exe again (StartMethod::Spawn), which must be the worker, not this test.
const lspawn::test::Worker kWorker{LSPAWN_COLLECTIVES_TEST_WORKER, &lspawn::test::strategies_worker_main};
const lspawn::test::Worker kWorkerProgram{LSPAWN_COLLECTIVES_TEST_WORKER};
}  // namespace
using lspawn::test::TempDir;

TEST_CASE("DDP (c10d::Reducer, several buckets) equals one process on the concatenated batch", "[strategies][ddp]") {
  for (int n : {2, 4}) {
    auto r = run_ranks(kWorker, n, "equiv", "gloo", {{"LSPAWN_TEST_STRATEGY", "ddp"}}, 90s);
    require_all_ok(r);
    CHECK_THAT(r.ranks[0].output, Contains("max_abs_diff"));
  }
}

TEST_CASE("DDP find_unused_parameters: a parameter the loss never reaches does not stall the buckets",
          "[strategies][ddp]") {
  require_all_ok(run_ranks(kWorker, 2, "equiv", "gloo", {{"LSPAWN_TEST_STRATEGY", "ddp_unused"}}, 90s));
}

TEST_CASE("DDP with the shm comm hook equals one process (buckets through shared memory)", "[strategies][ddp]") {
  auto r = run_ranks(kWorker, 2, "equiv", "shm", {{"LSPAWN_TEST_STRATEGY", "ddp_hook"}}, 90s);
  require_all_ok(r);
}

// The Trainer's next fit after a failed one: the first module's backward throws midway (a gradient
// hook), with buckets still queued on rank 0's hook thread, while rank 1's has reduced them (it
// sets up 300 ms later); setup() of the second module reduces them first, then trains it as one
// process would.
TEST_CASE(
    "DDP with the shm comm hook: after a backward that throws midway, setup() of the next module reduces the buckets "
    "in flight first",
    "[strategies][ddp][failure]") {
  auto r = run_ranks(kWorker, 2, "equiv", "shm",
                     {{"LSPAWN_TEST_STRATEGY", "ddp_hook"}, {"LSPAWN_TEST_FAILED_BACKWARD", "1"}}, 90s);
  require_all_ok(r);
  for (const auto& rank : r.ranks)
    CHECK_THAT(rank.output, Catch::Contains("the first module's backward threw as planned"));
}

// Across nodes (faked on this machine: LSPAWN_TEST_NODES gives each rank a node id) the group is
// hierarchical, and the hook reduces each bucket through it: shm on each node, gloo among the two
// leaders (collectives/hierarchy.hpp).
TEST_CASE("DDP with the shm comm hook across nodes (hierarchical) equals one process",
          "[strategies][ddp][hierarchical]") {
  const std::map<std::string, std::string> env = {{"LSPAWN_TEST_STRATEGY", "ddp_hook"},
                                                  {"LSPAWN_TEST_NODES", "0,0,1,1"},
                                                  {"LSPAWN_TEST_EXPECT_BACKEND", "hierarchical"}};
  auto r = run_ranks(kWorker, 4, "equiv", "auto", env, 90s);
  require_all_ok(r);
  CHECK_THAT(r.ranks[0].output, Contains("ddp_hook auto N=4 max_abs_diff"));
  require_all_ok(run_ranks(kWorker, 4, "bucket_view", "auto", env, 90s));
}

TEST_CASE("DDP's hierarchical hook: a rank that dies mid-training is named by the others, who stop",
          "[strategies][ddp][hierarchical][failure]") {
  // Rank 3 (node 1, not its leader) dies before its second backward; its node's leader sees it
  // die through shm and leaves the group's failure note; node 0's ranks learn it from the
  // leaders' gloo connection closing, and name rank 3 too, not their neighbour.
  auto r = run_ranks(kWorker, 4, "equiv", "auto",
                     {{"LSPAWN_TEST_STRATEGY", "ddp_hook"},
                      {"LSPAWN_TEST_NODES", "0,0,1,1"},
                      {"LSPAWN_TEST_EXPECT_BACKEND", "hierarchical"},
                      {"LSPAWN_TEST_DIE_RANK", "3"}},
                     90s);
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.seconds < 45);  // stopped by the death, not by the group's 60 s timeout
  CHECK(r.ranks[3].exit_code == 7);
  for (int q : {0, 1, 2}) {
    INFO("rank " << q << ": " << r.ranks[q].output);
    CHECK(r.ranks[q].signal == 0);
    CHECK(r.ranks[q].exit_code == 5);
    CHECK_THAT(r.ranks[q].output, Contains("rank 3"));
  }
}

// N = 4 for XLA runs through XLASpawn below.
TEST_CASE("XLA strategy (grads all-reduced at optimizer_step, shm) equals one process", "[strategies][xla]") {
  require_all_ok(run_ranks(kWorker, 2, "equiv", "shm", {{"LSPAWN_TEST_STRATEGY", "xla"}}, 90s));
}

TEST_CASE(
    "DDP gradient_as_bucket_view: zero_grad keeps the gradients as bucket views, results equal copies and one process",
    "[strategies][ddp]") {
  auto r = run_ranks(kWorker, 2, "bucket_view", "gloo", {{"LSPAWN_TEST_STRATEGY", "ddp"}}, 90s);
  require_all_ok(r);
  CHECK_THAT(r.ranks[0].output, Contains("max_abs_diff vs plain"));
  require_all_ok(run_ranks(kWorker, 2, "bucket_view", "shm", {{"LSPAWN_TEST_STRATEGY", "ddp_hook"}}, 90s));
}

TEST_CASE("DDP no_sync accumulation equals a larger batch", "[strategies][ddp]") {
  require_all_ok(run_ranks(kWorker, 2, "nosync", "gloo", {}, 90s));
}

TEST_CASE("strategy calls: barrier, broadcast, all_gather (sync_grads), reduce, reduce_boolean_decision",
          "[strategies]") {
  for (const char* backend : {"gloo", "shm"}) {
    auto r = run_ranks(kWorker, 3, "calls", backend, {}, 90s);
    require_all_ok(r);
    CHECK_THAT(r.ranks[0].output, Contains("strategy calls ok"));
  }
}

TEST_CASE("checkpoints: rank 0 writes atomically, resume reproduces the uninterrupted run",
          "[strategies][checkpoint]") {
  TempDir dir;
  auto r = run_ranks(kWorker, 2, "checkpoint", "gloo", {{"LSPAWN_TEST_DIR", dir.path}}, 90s);
  require_all_ok(r);
  CHECK_THAT(r.ranks[0].output, Contains("resume max_abs_diff 0"));
}

TEST_CASE("a rank throwing inside training_step stops the run with that rank named", "[strategies][failure]") {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  lspawn::test::ChildProcess c({LSPAWN_BIN, "--nprocs", "3", LSPAWN_COLLECTIVES_TEST_WORKER, "throw"},
                               {{"LSPAWN_TEST_THROW_RANK", "1"}, {"LSPAWN_PG_TIMEOUT", "120"}}, dir.file("out"));
  const auto st = c.wait_or_kill(180s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(c.output());
  CHECK_FALSE(st.timed_out);
  CHECK(st.exited);
  CHECK(st.code != 0);
  CHECK_THAT(c.output(), Contains("rank 1") && Contains("training_step failed on purpose at batch 2"));
  CHECK(seconds < 60);  // the others were stopped, not left to their 120 s collective timeout
}

// #34: DDP's Reducer issues its all_reduces on the group's c10d process group (gloo, no shm hook):
// they enter the status record (runtime/recorded_backend.hpp), so --hang-timeout names the rank
// that stopped between two backward passes while the others wait in the Reducer's all_reduce.
TEST_CASE("DDP on gloo: a rank that stops between backward passes is named by --hang-timeout",
          "[strategies][ddp][hang]") {
  TempDir dir;
  lspawn::test::ChildProcess c({LSPAWN_BIN, "--nprocs", "3", "--hang-timeout", "2", "--grace-period", "2",
                                LSPAWN_COLLECTIVES_TEST_WORKER, "stall"},
                               {{"LSPAWN_TEST_STALL_RANK", "1"}}, dir.file("out"));
  const auto st = c.wait_or_kill(120s);
  INFO(c.output());
  CHECK_FALSE(st.timed_out);
  CHECK(st.exited);
  CHECK(st.code == 124);
  CHECK_THAT(c.output(), Contains("lspawn: hang: no rank made progress in its collectives for "));
  CHECK_THAT(c.output(), Contains("waiting: ranks 0, 2 in all_reduce #") && Contains(" on group world.gloo, "));
  CHECK_THAT(c.output(), Contains("behind: rank 1 "));
  CHECK_THAT(c.output(), Contains("stalled_between_backward_passes"));
}

namespace {
// StartMethod::Fork where the worker process allows it (one thread): on a machine without a GPU
// that must be fork; on one with a GPU, CUDA's thread makes it spawn (Fork's refusal is right).
void check_start_chosen(const std::string& output) {
  if (machine_has_nvidia_gpu()) {
    CHECK_THAT(output, Contains("start method chosen: "));
  } else {
    CHECK_THAT(output, Contains("start method chosen: fork (1 thread)"));
  }
}
}  // namespace

TEST_CASE("DDPSpawn: the caller gets rank 0's weights, metrics and checkpoint (fork where allowed, and spawn)",
          "[strategies][spawn]") {
  for (const char* start : {"fork-if-allowed", "spawn"}) {
    TempDir dir;
    auto r = run_ranks(kWorkerProgram, 1, "spawn", "gloo",
                       {{"LSPAWN_TEST_STRATEGY", "ddp"},
                        {"LSPAWN_TEST_START", start},
                        {"LSPAWN_TEST_NPROCS", "2"},
                        {"LSPAWN_TEST_DIR", dir.path}},
                       90s);
    require_all_ok(r);
    if (std::string(start) == "fork-if-allowed") check_start_chosen(r.ranks[0].output);
  }
}

TEST_CASE("DDPSpawn and XLASpawn with 4 workers equal one process", "[strategies][spawn]") {
  for (const char* kind : {"ddp", "xla"}) {
    TempDir dir;
    auto r = run_ranks(kWorkerProgram, 1, "spawn", "gloo",
                       {{"LSPAWN_TEST_STRATEGY", kind},
                        {"LSPAWN_TEST_START", "fork-if-allowed"},
                        {"LSPAWN_TEST_NPROCS", "4"},
                        {"LSPAWN_TEST_DIR", dir.path}},
                       90s);
    require_all_ok(r);
    check_start_chosen(r.ranks[0].output);
  }
}

#ifdef LSPAWN_DIGITS_DDP
namespace {
double accuracy_in(const std::string& out) {
  const auto at = out.find("test accuracy ");
  return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 14));
}
}  // namespace

TEST_CASE("examples/digits_ddp: DDP under lspawn --nprocs 4 and DDPSpawn reach test accuracy >= 0.95",
          "[strategies][examples]") {
  const char* csv = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
  if (::access(csv, R_OK) != 0) {
    WARN("python3-sklearn's digits data is not installed (scripts/install-deps.sh): skipped");
    return;
  }
  TempDir dir;
  {
    lspawn::test::ChildProcess c({LSPAWN_BIN, "--nprocs", "4", LSPAWN_DIGITS_DDP, "--epochs", "15"}, {},
                                 dir.file("ddp"));
    const auto st = c.wait_or_kill(120s);
    INFO(c.output());
    CHECK(st.exited);
    CHECK(st.code == 0);
    CHECK(accuracy_in(c.output()) >= 0.95);
  }
  {
    lspawn::test::ChildProcess c({LSPAWN_DIGITS_DDP, "--spawn", "4", "--start", "forkserver", "--epochs", "15"}, {},
                                 dir.file("spawn"));
    const auto st = c.wait_or_kill(120s);
    INFO(c.output());
    CHECK(st.exited);
    CHECK(st.code == 0);
    CHECK(accuracy_in(c.output()) >= 0.95);
  }
}
#endif
