// The node group (cluster/node_group.hpp) in one process: K groups on 127.0.0.1, each driven on
// its own thread as launcher/run.cpp drives it, with fake workers (node_group_harness.hpp).
// Rendezvous, a failure, a restart, a node lost (its lspawn dies, or goes silent), a node joining
// an elastic job, and a hang. Each case waits on conditions with deadlines, never on sleeps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>

#include "cluster/node_group_harness.hpp"
#include "support/loopback.hpp"
#include "sys/exit_codes.hpp"

using namespace lspawn;
using namespace lspawn::test;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kForm{5000};    // the rendezvous on loopback takes milliseconds
constexpr milliseconds kSettle{5000};  // a round's end, a stop, a start

bool formed(const NodeView& v) { return v.formed; }
bool finished(const NodeView& v) { return v.finish.has_value(); }
bool ended(const NodeView& v) { return v.ended; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every node's assignment names the same job: run id, workers' master, node count, hosts; node
// ranks 0..n-1, each once; the coordinator is the one node that says it is.
void check_one_job(LoopbackJob& job, int nnodes) {
  const NodeView first = job[0].view();
  std::set<int> ranks;
  int coordinators = 0;
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.assignment.nnodes == nnodes);
    CHECK_FALSE(v.assignment.run_id.empty());
    CHECK(v.assignment.run_id == first.assignment.run_id);
    CHECK(v.assignment.master_addr == "127.0.0.1");
    CHECK(v.assignment.master_port > 0);
    CHECK(v.assignment.master_port != job.port());
    CHECK(v.assignment.master_port == first.assignment.master_port);
    CHECK(v.assignment.hosts == first.assignment.hosts);
    REQUIRE(v.assignment.hosts.size() == static_cast<size_t>(nnodes));
    CHECK(v.assignment.hosts[static_cast<size_t>(v.assignment.node_rank)] == n->host());
    CHECK(v.assignment.coordinator == first.assignment.coordinator);
    ranks.insert(v.assignment.node_rank);
    coordinators += v.coordinator;
    if (v.coordinator) CHECK(v.assignment.node_rank == v.assignment.coordinator);
  }
  CHECK(coordinators == 1);
  CHECK(ranks.size() == static_cast<size_t>(nnodes));
  CHECK(*ranks.begin() == 0);
  CHECK(*ranks.rbegin() == nnodes - 1);
}

// Every node's workers exit 0: the job finishes 0 everywhere, in round `round`.
void succeed_everywhere(LoopbackJob& job, int round) {
  for (auto& n : job.nodes()) n->succeed();
  REQUIRE(job.await_all(finished, kSettle));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.finish->exit_code == 0);
    CHECK_FALSE(v.finish->failed);
    CHECK(v.finish->restart_count == round);
  }
}

// The finish of a job that failed with a worker's exit code.
void check_worker_finish(const NodeView& v, int exit_code, int node_rank, int rank, const std::string& host) {
  REQUIRE(v.finish);
  CHECK(v.finish->failed);
  CHECK(v.finish->exit_code == exit_code);
  CHECK(v.finish->cause.kind == "worker");
  CHECK(v.finish->cause.node_rank == node_rank);
  CHECK(v.finish->cause.rank == rank);
  CHECK(v.finish->cause.host == host);
}

}  // namespace

// ---- Rendezvous ---------------------------------------------------------------------------------

TEST_CASE("node group: static mode, 3 nodes meet and agree on the job", "[cluster][node_group]") {
  LoopbackJob job;
  // The members first: they try node 0 until it listens.
  job.add(job.static_options(3, 2));
  job.add(job.static_options(3, 1));
  job.add(job.static_options(3, 0));
  REQUIRE(job.await_all(formed, kForm));
  check_one_job(job, 3);
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.assignment.node_rank == std::stoi(n->host().substr(4)));  // the ranks given
    CHECK(v.coordinator == (v.assignment.node_rank == 0));
    CHECK(v.round == 0);
    CHECK(v.rounds_started.empty());  // round 0 starts at the rendezvous, not by take_start()
  }
  CHECK(job[0].view().assignment.hosts == std::vector<std::string>{"node0", "node1", "node2"});
  succeed_everywhere(job, 0);
}

TEST_CASE("node group: --rdzv-endpoint mode, whoever binds the endpoint hosts the rendezvous", "[cluster][node_group]") {
  LoopbackJob job;
  for (const char* h : {"a", "b", "c"}) job.add(job.rdzv_options(3, 0, h));
  REQUIRE(job.await_all(formed, kForm));
  check_one_job(job, 3);
  // The coordinator is node 0 (coordinator first, the others in join order) and its workers'
  // store port is the one it reserved.
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    if (v.coordinator) CHECK(v.assignment.node_rank == 0);
  }
  succeed_everywhere(job, 0);
}

TEST_CASE("node group: a node of another job shape is refused, naming the mismatch", "[cluster][node_group]") {
  LoopbackJob job;
  auto other = job.static_options(2, 1);
  std::string expected;
  SECTION("--nproc-per-node") {
    other.nproc_per_node = 2;
    expected = "has --nproc-per-node 2, this node 1";
  }
  SECTION("--nnodes") {
    other.nnodes = 3;
    expected = "has --nnodes 3, node 0 2";
  }
  SECTION("--max-restarts") {
    other.max_restarts = 2;
    expected = "has --max-restarts 2, this node 0";
  }
  job.add(job.static_options(2, 0));
  job.add(other);
  REQUIRE(job.await_all(ended, kForm));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host() << ": " << v.rendezvous_error);
    CHECK_FALSE(v.formed);
    // Both lspawns fail with the coordinator's reason (the member gets it as a reject).
    CHECK(contains(v.rendezvous_error, expected));
    CHECK(contains(v.rendezvous_error, "node1"));
    CHECK(contains(v.rendezvous_error, job.endpoint()));
  }
}

TEST_CASE("node group: two nodes with the same --node-rank: every node is refused, naming both", "[cluster][node_group]") {
  LoopbackJob job;
  job.add(job.static_options(3, 0));
  auto b = job.static_options(3, 1);
  b.host = "b";
  auto c = job.static_options(3, 1);
  c.host = "c";
  job.add(b);
  job.add(c);
  REQUIRE(job.await_all(ended, kForm));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host() << ": " << v.rendezvous_error);
    CHECK_FALSE(v.formed);
    CHECK(contains(v.rendezvous_error, "both have --node-rank 1"));
    CHECK(contains(v.rendezvous_error, "b ("));
    CHECK(contains(v.rendezvous_error, "c ("));
  }
}

TEST_CASE("node group: the rendezvous times out, naming what is missing", "[cluster][node_group]") {
  LoopbackJob job;
  // Each lspawn counts its --rdzv-timeout from its own start. Node 0 first here, so it is up
  // when node 1 tries to join.
  const auto two_of_three = [&](milliseconds timeout0, milliseconds timeout1) {
    auto o0 = job.static_options(3, 0);
    o0.rdzv_timeout = timeout0;
    job.add(o0);
    REQUIRE(job[0].await([](const NodeView& v) { return v.has_info("rendezvous: waiting for 2 more nodes"); }, kForm));
    auto o1 = job.static_options(3, 1);
    o1.rdzv_timeout = timeout1;
    job.add(o1);
    REQUIRE(job.await_all(ended, kForm));
  };
  SECTION("2 of 3 nodes come, node 0 times out first: both say 2/3 joined") {
    two_of_three(milliseconds(400), milliseconds(3000));
    for (auto& n : job.nodes()) {
      const NodeView v = n->view();
      INFO(n->host() << ": " << v.rendezvous_error);
      CHECK_FALSE(v.formed);
      // node 1 gets node 0's reason (a reject)
      CHECK(contains(v.rendezvous_error, "rendezvous on " + job.endpoint() + " timed out after 0.4 s"));
      CHECK(contains(v.rendezvous_error, "2/3 nodes joined"));
    }
  }
  SECTION("2 of 3 nodes come, node 1 times out first: it says how many had joined; node 0 no longer counts it") {
    two_of_three(milliseconds(1000), milliseconds(400));
    const NodeView v1 = job[1].view();
    INFO(v1.rendezvous_error);
    CHECK(contains(v1.rendezvous_error, "timed out after 0.4 s waiting for the other nodes (2 had joined when this node did)"));
    const NodeView v0 = job[0].view();
    INFO(v0.rendezvous_error);
    CHECK(contains(v0.rendezvous_error, "timed out after 1 s: 1/3 nodes joined"));
  }
  SECTION("node 0 never comes: a member says it could not be reached") {
    auto o = job.static_options(2, 1);
    o.rdzv_timeout = milliseconds(400);
    const auto t0 = std::chrono::steady_clock::now();
    job.add(o);
    REQUIRE(job.await_all(ended, kForm));
    const NodeView v = job[0].view();
    INFO(v.rendezvous_error);
    CHECK(std::chrono::steady_clock::now() - t0 >= milliseconds(400));
    CHECK(contains(v.rendezvous_error, "timed out after"));
    CHECK(contains(v.rendezvous_error, "node 0 could not be reached: connect: Connection refused"));
  }
}

// ---- A failure ----------------------------------------------------------------------------------

TEST_CASE("node group: a worker fails on node 1, every node stops and finishes with its exit code", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) job.add(job.static_options(3, r));
  REQUIRE(job.await_all(formed, kForm));
  job[1].fail(0, 7);
  REQUIRE(job.await_all(finished, kSettle));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    // The nodes whose workers ran were asked to stop them (stop_requested()) before the round
    // ended. (The failing node's workers had all exited: the stop may come with the finish.)
    if (n.get() != &job[1]) CHECK(v.stopped_in(0));
    CHECK(v.rounds_done == std::vector<int>{0});
    check_worker_finish(v, 7, 1, 1, "node1");
    CHECK(v.finish->restart_count == 0);
    CHECK(v.restarts_used == 0);
    CHECK(v.failed_attempts.empty());
  }
}

TEST_CASE("node group: the root cause is the earliest worker failure, also one that failed while stopping", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) job.add(job.static_options(3, r));
  REQUIRE(job.await_all(formed, kForm));
  job[2].hold_workers_on_stop();  // its worker takes its grace period
  const int64_t t = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
  job[1].fail(0, 7, t);
  REQUIRE(job[2].await([](const NodeView& v) { return v.stopped_in(0); }, kSettle));
  // Node 2's worker failed too, while being stopped, and its failure time is earlier.
  job[2].fail(0, 9, t - 1000);
  REQUIRE(job.await_all(finished, kSettle));
  for (auto& n : job.nodes()) {
    INFO(n->host());
    check_worker_finish(n->view(), 9, 2, 2, "node2");
  }
}

TEST_CASE("node group: --max-restarts 1, a failure restarts every node, then the job succeeds", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) {
    auto o = job.static_options(3, r);
    o.max_restarts = 1;
    job.add(o);
  }
  REQUIRE(job.await_all(formed, kForm));
  const std::string run_id = job[0].view().assignment.run_id;
  job[1].fail(0, 3);
  REQUIRE(job.await_all([](const NodeView& v) { return v.round == 1; }, kSettle));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.rounds_started == std::vector<int>{1});  // take_start() gave round 1 once
    // Node 1's workers had exited: its stop and start may come in one read, never seen between.
    if (n.get() != &job[1]) CHECK(v.stopped_in(0));
    CHECK_FALSE(v.finish);
    CHECK(v.restarts_used == 1);
    CHECK(v.failed_attempts ==
          std::vector<std::string>{"attempt 0 failed (process 1 terminated with exit code 3 on node 1 (node1))"});
    CHECK(v.assignment.run_id == run_id);  // a restart is the same job
  }
  SECTION("round 1 succeeds: exit 0") { succeed_everywhere(job, 1); }
  SECTION("round 1 fails too: no restart left, its exit code") {
    job[0].fail(0, 5);
    REQUIRE(job.await_all(finished, kSettle));
    for (auto& n : job.nodes()) {
      const NodeView v = n->view();
      INFO(n->host());
      check_worker_finish(v, 5, 0, 0, "node0");
      CHECK(v.finish->restart_count == 1);
      CHECK(v.restarts_used == 1);
      CHECK(v.failed_attempts.size() == 1);  // the attempts restarted; the last is the finish
    }
  }
}

TEST_CASE("node group: two nodes fail in the same round: one restart, the earlier failure named", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) {
    auto o = job.static_options(3, r);
    o.max_restarts = 1;
    job.add(o);
  }
  REQUIRE(job.await_all(formed, kForm));
  const int64_t t = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
  job[1].fail(0, 3, t);
  job[2].fail(0, 4, t - 500);
  REQUIRE(job.await_all([](const NodeView& v) { return v.round == 1; }, kSettle));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.rounds_started == std::vector<int>{1});  // one start, not one per failure
    CHECK(v.restarts_used == 1);
    CHECK(v.failed_attempts ==
          std::vector<std::string>{"attempt 0 failed (process 2 terminated with exit code 4 on node 2 (node2))"});
  }
  succeed_everywhere(job, 1);
}

// ---- A node lost --------------------------------------------------------------------------------

TEST_CASE("node group: an lspawn dies, the others finish with kNodeLost naming it", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) job.add(job.static_options(3, r));
  REQUIRE(job.await_all(formed, kForm));
  const int dead = GENERATE(2, 0);  // a member; the coordinator
  INFO("node " << dead << " dies");
  job[static_cast<size_t>(dead)].die();
  for (int r = 0; r < 3; ++r) {
    if (r == dead) continue;
    auto& n = job[static_cast<size_t>(r)];
    REQUIRE(n.await(finished, kSettle));
    const NodeView v = n.view();
    INFO(n.host());
    CHECK(v.stopped_in(0));
    CHECK(v.finish->failed);
    CHECK(v.finish->exit_code == exit_codes::kNodeLost);
    CHECK(v.finish->cause.kind == "node-lost");
    CHECK(v.finish->cause.node_rank == dead);
    CHECK(v.finish->cause.host == "node" + std::to_string(dead));
    CHECK(contains(v.finish->cause.text, "node " + std::to_string(dead) + " (node" + std::to_string(dead)));
  }
}

TEST_CASE("node group: a node dies while its workers stop for another's failure: the lost node is the root cause", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) job.add(job.static_options(3, r));
  REQUIRE(job.await_all(formed, kForm));
  job[2].hold_workers_on_stop();
  job[1].fail(0, 7);
  REQUIRE(job[2].await([](const NodeView& v) { return v.stopped_in(0); }, kSettle));
  job[2].die();
  // No hang: the lost node counts as done. A lost node explains the failures around it
  // (round.hpp's root_cause), so the job ends with kNodeLost, not the worker's 7.
  for (size_t i : {0u, 1u}) {
    REQUIRE(job[i].await(finished, kSettle));
    const NodeView v = job[i].view();
    INFO(job[i].host());
    CHECK(v.finish->exit_code == exit_codes::kNodeLost);
    CHECK(v.finish->cause.kind == "node-lost");
    CHECK(v.finish->cause.node_rank == 2);
  }
}

TEST_CASE("node group: the coordinator dies after a member's workers are done: the member finishes at once", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 2; ++r) job.add(job.static_options(2, r));
  REQUIRE(job.await_all(formed, kForm));
  job[1].succeed();
  REQUIRE(job[1].await([](const NodeView& v) { return v.rounds_done.size() == 1; }, kSettle));
  job[0].die();
  REQUIRE(job[1].await(finished, kSettle));
  const NodeView v = job[1].view();
  CHECK(v.finish->exit_code == exit_codes::kNodeLost);
  CHECK(v.finish->cause.kind == "node-lost");
  CHECK(v.finish->cause.node_rank == 0);
  CHECK(v.finish->cause.host == "node0");
}

TEST_CASE("node group: a node that goes silent past --node-timeout is lost", "[cluster][node_group]") {
  // Long enough that a node driven on a loaded machine (2 cores shared, a build running) is not
  // silent by accident: 800 ms failed once in 20 runs at load ~7 (node 1 lost the coordinator).
  constexpr milliseconds kTimeout{1500};
  LoopbackJob job;
  for (int r = 0; r < 3; ++r) {
    auto o = job.static_options(3, r);
    o.node_timeout = kTimeout;
    job.add(o);
  }
  REQUIRE(job.await_all(formed, kForm));
  const int silent = GENERATE(2, 0);  // a member; the coordinator
  INFO("node " << silent << " goes silent");
  const auto t0 = std::chrono::steady_clock::now();
  job[static_cast<size_t>(silent)].go_silent();  // no heartbeats, its connection open
  for (int r = 0; r < 3; ++r) {
    if (r == silent) continue;
    auto& n = job[static_cast<size_t>(r)];
    REQUIRE(n.await(finished, kSettle));
    const NodeView v = n.view();
    INFO(n.host());
    CHECK(v.stopped_in(0));
    CHECK(v.finish->exit_code == exit_codes::kNodeLost);
    CHECK(v.finish->cause.kind == "node-lost");
    CHECK(v.finish->cause.node_rank == silent);
    CHECK(contains(v.finish->cause.text, "(--node-timeout)"));
  }
  // Not before its silence could have reached the timeout: its last heartbeat came at most one
  // heartbeat interval (timeout / 4) before it went silent.
  CHECK(std::chrono::steady_clock::now() - t0 >= kTimeout - kTimeout / 4);
  CHECK_FALSE(job[static_cast<size_t>(silent)].view().finish);
}

TEST_CASE("node group: elastic 2:3, a node lost with a restart left, the next round runs on the survivors", "[cluster][node_group]") {
  LoopbackJob job;
  for (const char* h : {"a", "b", "c"}) {
    auto o = job.rdzv_options(3, 2, h);
    o.max_restarts = 1;
    job.add(o);
  }
  REQUIRE(job.await_all(formed, kForm));  // MAX joined: no last call
  check_one_job(job, 3);
  // A member dies (the coordinator is node 0 and hosts the endpoint).
  size_t dead = 0;
  while (job[dead].view().coordinator) ++dead;
  const std::string dead_host = job[dead].host();
  const int dead_rank = job[dead].view().assignment.node_rank;
  job[dead].die();
  std::vector<size_t> survivors;
  for (size_t i = 0; i < 3; ++i)
    if (i != dead) survivors.push_back(i);
  for (size_t i : survivors) {
    REQUIRE(job[i].await([](const NodeView& v) { return v.round == 1; }, kSettle));
    const NodeView v = job[i].view();
    INFO(job[i].host());
    CHECK(v.stopped_in(0));
    CHECK(v.rounds_started == std::vector<int>{1});
    CHECK(v.restarts_used == 1);  // a lost node's round is a failed attempt
    REQUIRE(v.failed_attempts.size() == 1);
    CHECK(contains(v.failed_attempts[0], "attempt 0 failed (node " + std::to_string(dead_rank) + " (" + dead_host));
    CHECK(v.assignment.nnodes == 2);
    CHECK(v.assignment.hosts.size() == 2);
    CHECK(std::find(v.assignment.hosts.begin(), v.assignment.hosts.end(), dead_host) == v.assignment.hosts.end());
    CHECK(v.assignment.node_rank == (v.coordinator ? 0 : 1));  // renumbered 0..n-1
  }
  for (size_t i : survivors) job[i].succeed();
  for (size_t i : survivors) {
    REQUIRE(job[i].await(finished, kSettle));
    CHECK(job[i].view().finish->exit_code == 0);
    CHECK(job[i].view().finish->restart_count == 1);
  }
}

// ---- A node joining -----------------------------------------------------------------------------

TEST_CASE("node group: elastic 2:3 forms with 2 after last call, a third joins and the next round admits it", "[cluster][node_group]") {
  LoopbackJob job;
  job.add(job.rdzv_options(3, 2, "a"));
  job.add(job.rdzv_options(3, 2, "b"));
  REQUIRE(job.await_all(formed, kForm));
  check_one_job(job, 2);
  const std::string run_id = job[0].view().assignment.run_id;
  const int rank_a = job[0].view().assignment.node_rank, rank_b = job[1].view().assignment.node_rank;
  // The coordinator waited its last call once 2 had joined.
  int last_calls = 0;
  for (auto& n : job.nodes()) last_calls += n->view().has_info("rendezvous: 2 nodes joined (--nnodes 2:3): waiting");
  CHECK(last_calls == 1);

  HarnessNode& c = job.add(job.rdzv_options(3, 2, "c"));
  REQUIRE(job.await_all([](const NodeView& v) { return v.round == 1 && v.assignment.nnodes == 3; }, kSettle));
  check_one_job(job, 3);
  for (size_t i : {0u, 1u}) {
    const NodeView v = job[i].view();
    INFO(job[i].host());
    CHECK(v.stopped_in(0));                           // the join stopped round 0
    CHECK(v.rounds_started == std::vector<int>{1});
    CHECK(v.restarts_used == 0);                      // not a restart
    CHECK(v.failed_attempts.empty());
    CHECK(v.assignment.node_rank == (i == 0 ? rank_a : rank_b));  // the old nodes keep their order
  }
  const NodeView cv = c.view();
  CHECK(cv.formed);
  CHECK(cv.rounds_started.empty());  // its assignment starts it
  CHECK(cv.assignment.node_rank == 2);  // the new one after the old ones
  CHECK(cv.assignment.restart_count == 1);
  CHECK(cv.restarts_used == 0);
  CHECK(cv.assignment.run_id == run_id);
  succeed_everywhere(job, 1);
}

TEST_CASE("node group: elastic, a node that cannot join is turned away and the job goes on", "[cluster][node_group]") {
  LoopbackJob job;
  job.add(job.rdzv_options(3, 2, "a"));
  job.add(job.rdzv_options(3, 2, "b"));
  REQUIRE(job.await_all(formed, kForm));
  SECTION("another --nproc-per-node: refused at once, the round is not stopped") {
    auto o = job.rdzv_options(3, 2, "c");
    o.nproc_per_node = 2;
    HarnessNode& c = job.add(o);
    REQUIRE(c.await(ended, kSettle));
    const NodeView cv = c.view();
    INFO(cv.rendezvous_error);
    CHECK_FALSE(cv.formed);
    CHECK(contains(cv.rendezvous_error, "(c) has --nproc-per-node 2, this node 1"));
    for (size_t i : {0u, 1u}) {
      CHECK(job[i].view().rounds_stopped.empty());
      job[i].succeed();
    }
    for (size_t i : {0u, 1u}) {
      REQUIRE(job[i].await(finished, kSettle));
      CHECK(job[i].view().finish->exit_code == 0);
      CHECK(job[i].view().finish->restart_count == 0);
    }
  }
  SECTION("it comes while a node's workers are done: it waits, and the job ends without it") {
    size_t member = 0;
    while (job[member].view().coordinator) ++member;
    const size_t coord = 1 - member;
    // The coordinator's own workers are done (what it knows without a message in flight).
    job[coord].succeed();
    REQUIRE(job[coord].await([](const NodeView& v) { return v.rounds_done.size() == 1; }, kSettle));
    HarnessNode& c = job.add(job.rdzv_options(3, 2, "c"));
    REQUIRE(job[coord].await([](const NodeView& v) { return v.has_info("it is admitted if the job goes on"); }, kSettle));
    CHECK(job[member].view().rounds_stopped.empty());  // the round goes on: it may be about to succeed
    job[member].succeed();
    REQUIRE(c.await(ended, kSettle));
    const NodeView cv = c.view();
    INFO(cv.rendezvous_error);
    CHECK_FALSE(cv.formed);
    CHECK(contains(cv.rendezvous_error, "the job ended (exit code 0) before this node could join"));
    for (size_t i : {0u, 1u}) {
      REQUIRE(job[i].await(finished, kSettle));
      CHECK(job[i].view().finish->exit_code == 0);
    }
  }
}

TEST_CASE("node group: elastic, a node that comes while a failed round stops joins the restarted round", "[cluster][node_group]") {
  LoopbackJob job;
  for (const char* h : {"a", "b"}) {
    auto o = job.rdzv_options(3, 2, h);
    o.max_restarts = 1;
    job.add(o);
  }
  REQUIRE(job.await_all(formed, kForm));
  size_t member = 0;
  while (job[member].view().coordinator) ++member;
  const size_t coord = 1 - member;
  job[coord].hold_workers_on_stop();
  job[member].fail(0, 3);
  REQUIRE(job[coord].await([](const NodeView& v) { return v.stopped_in(0); }, kSettle));
  auto oc = job.rdzv_options(3, 2, "c");
  oc.max_restarts = 1;
  HarnessNode& c = job.add(oc);
  REQUIRE(job[coord].await([](const NodeView& v) { return v.has_info("it is admitted if the job goes on"); }, kSettle));
  job[coord].succeed();  // its workers have stopped
  REQUIRE(job.await_all([](const NodeView& v) { return v.round == 1 && v.assignment.nnodes == 3; }, kSettle));
  check_one_job(job, 3);
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.restarts_used == 1);  // the worker's failure is the restart; the join rides along
    CHECK(v.assignment.restarts_used == 1);
  }
  CHECK(c.view().assignment.node_rank == 2);
  CHECK(c.view().rounds_started.empty());
  CHECK(job[coord].view().failed_attempts ==
        std::vector<std::string>{"attempt 0 failed (process " + std::to_string(job[member].view().assignment.node_rank) +
                                 " terminated with exit code 3 on node " +
                                 std::to_string(job[member].view().assignment.node_rank) + " (" + job[member].host() + "))"});
  succeed_everywhere(job, 1);
}

TEST_CASE("node group: elastic, bytes that are no lspawn's on the endpoint are turned away and the job goes on", "[cluster][node_group]") {
  LoopbackJob job;
  job.add(job.rdzv_options(3, 2, "a"));
  job.add(job.rdzv_options(3, 2, "b"));
  REQUIRE(job.await_all(formed, kForm));
  size_t coord = 0;
  while (!job[coord].view().coordinator) ++coord;
  const int fd = connect_to(static_cast<uint16_t>(job.port()));
  REQUIRE(fd >= 0);
  const std::string junk(8, '\xff');  // a length far beyond kMaxFrame
  REQUIRE(::write(fd, junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
  REQUIRE(job[coord].await([](const NodeView& v) { return v.has_info("rejected connection from 127.0.0.1:"); }, kSettle));
  CHECK(job[coord].view().has_info("bad frame: length"));
  ::close(fd);
  for (auto& n : job.nodes()) CHECK(n->view().rounds_stopped.empty());
  succeed_everywhere(job, 0);
}

// ---- A hang -------------------------------------------------------------------------------------

TEST_CASE("node group: the coordinator's hang watchdog stops the job, every node finishes with kHang", "[cluster][node_group]") {
  LoopbackJob job;
  for (int r = 0; r < 2; ++r) {
    auto o = job.static_options(2, r);
    o.max_restarts = 1;
    job.add(o);
  }
  REQUIRE(job.await_all(formed, kForm));
  // The diagnosis travels on the channel: a member's status records to the coordinator, the
  // coordinator's request for stacks to the member.
  job[1].send_hang_message(0, "status");
  job[0].send_hang_message(1, "stacks?");
  const auto got = [](int from, const char* type) {
    return [=](const NodeView& v) {
      return std::find(v.hang_messages.begin(), v.hang_messages.end(), std::make_pair(from, std::string(type))) !=
             v.hang_messages.end();
    };
  };
  CHECK(job[0].await(got(1, "status"), kSettle));
  CHECK(job[1].await(got(0, "stacks?"), kSettle));

  job[0].hang();
  REQUIRE(job.await_all(finished, kSettle));
  for (auto& n : job.nodes()) {
    const NodeView v = n->view();
    INFO(n->host());
    CHECK(v.stopped_in(0));
    CHECK(v.finish->failed);
    CHECK(v.finish->exit_code == exit_codes::kHang);
    CHECK(v.finish->cause.kind == "hang");
    CHECK(v.finish->cause.node_rank == 0);
    CHECK(v.finish->cause.host == "node0");
    // A hang is not a worker failure: --max-restarts does not retry it (round.hpp's decide_round).
    CHECK(v.restarts_used == 0);
    CHECK(v.rounds_started.empty());
  }
}
