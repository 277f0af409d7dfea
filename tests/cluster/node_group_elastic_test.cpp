// Elastic node groups (--nnodes MIN:MAX) in one process (node_group_harness.hpp): a node lost
// (the survivors' round), a node that joins (the next round admits it), and nodes turned away.
// Each case waits on conditions with deadlines, never on sleeps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "cluster/node_group_checks.hpp"
#include "cluster/node_group_harness.hpp"
#include "support/loopback.hpp"
#include "sys/sys.hpp"

using namespace lspawn;
using namespace lspawn::test;

TEST_CASE("node group: elastic 2:3, a node lost with a restart left, the next round runs on the survivors",
          "[cluster][node_group]") {
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
  const int port0 = job[dead].view().assignment.master_port;
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
  check_fenced_port(job, survivors, port0);  // the dead node's workers would find round 0's port refused
  for (size_t i : survivors) job[i].succeed();
  for (size_t i : survivors) {
    REQUIRE(job[i].await(finished, kSettle));
    CHECK(job[i].view().finish->exit_code == 0);
    CHECK(job[i].view().finish->restart_count == 1);
  }
}

TEST_CASE("node group: elastic 2:3 forms with 2 after last call, a third joins and the next round admits it",
          "[cluster][node_group]") {
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
    CHECK(v.stopped_in(0));  // the join stopped round 0
    CHECK(v.rounds_started == std::vector<int>{1});
    CHECK(v.restarts_used == 0);  // not a restart
    CHECK(v.failed_attempts.empty());
    CHECK(v.assignment.node_rank == (i == 0 ? rank_a : rank_b));  // the old nodes keep their order
  }
  const NodeView cv = c.view();
  CHECK(cv.formed);
  CHECK(cv.rounds_started.empty());     // its assignment starts it
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
    REQUIRE(
        job[coord].await([](const NodeView& v) { return v.has_info("it is admitted if the job goes on"); }, kSettle));
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

TEST_CASE("node group: elastic, a node that comes while a failed round stops joins the restarted round",
          "[cluster][node_group]") {
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
        std::vector<std::string>{
            "attempt 0 failed (process " + std::to_string(job[member].view().assignment.node_rank) +
            " terminated with exit code 3 on node " + std::to_string(job[member].view().assignment.node_rank) + " (" +
            job[member].host() + "))"});
  succeed_everywhere(job, 1);
}

TEST_CASE("node group: elastic, bytes that are no lspawn's on the endpoint are turned away and the job goes on",
          "[cluster][node_group]") {
  LoopbackJob job;
  job.add(job.rdzv_options(3, 2, "a"));
  job.add(job.rdzv_options(3, 2, "b"));
  REQUIRE(job.await_all(formed, kForm));
  size_t coord = 0;
  while (!job[coord].view().coordinator) ++coord;
  sys::Fd stranger(connect_to(static_cast<uint16_t>(job.port())));
  REQUIRE(stranger);
  sys::write_all(stranger.get(), std::string(8, '\xff'), "stranger");  // a length far beyond kMaxFrame
  REQUIRE(
      job[coord].await([](const NodeView& v) { return v.has_info("rejected connection from 127.0.0.1:"); }, kSettle));
  CHECK(job[coord].view().has_info("bad frame: length"));
  stranger.reset();
  for (auto& n : job.nodes()) CHECK(n->view().rounds_stopped.empty());
  succeed_everywhere(job, 0);
}
