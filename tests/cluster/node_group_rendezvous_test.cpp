// The node group's rendezvous in one process (node_group_harness.hpp): static and
// --rdzv-endpoint mode agree on one job; a node of another shape, a --node-rank clash and a
// timeout are refused with errors that name what was wrong.
// Each case waits on conditions with deadlines, never on sleeps.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "cluster/node_group_checks.hpp"
#include "cluster/node_group_harness.hpp"
#include "support/loopback.hpp"
#include "sys/sys.hpp"

using namespace lspawn;
using namespace lspawn::test;
using std::chrono::milliseconds;

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

TEST_CASE("node group: --rdzv-endpoint mode, whoever binds the endpoint hosts the rendezvous",
          "[cluster][node_group]") {
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

TEST_CASE("node group: two nodes with the same --node-rank: every node is refused, naming both",
          "[cluster][node_group]") {
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
    CHECK(contains(v1.rendezvous_error,
                   "timed out after 0.4 s waiting for the other nodes (2 had joined when this node did)"));
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

// A node that joined and then went away before the job formed is no longer counted, and the
// coordinator says so (it closes its end of that link; before, silently). The one that goes away
// here is a bare connection speaking the node protocol through cluster's Link; a real node with
// its --node-rank joins after it, and the job forms.
TEST_CASE("node group: a node that joins and goes away before the job forms is said, and no longer counted",
          "[cluster][node_group]") {
  LoopbackJob job;
  job.add(job.static_options(3, 0));
  REQUIRE(job[0].await([](const NodeView& v) { return v.has_info("rendezvous: waiting for 2 more nodes"); }, kForm));
  {
    int err = 0;
    sys::Fd fd = sys::tcp_connect("127.0.0.1", job.port(), kForm, &err);
    REQUIRE(fd);
    node::Link gone(std::move(fd), "the coordinator");
    node::JoinMsg j;
    j.host = "early";
    j.node_rank = 1;
    j.nnodes = 3;
    j.nproc_per_node = 1;
    gone.send("join", j);
    std::vector<node::Message> got;
    while (got.empty()) got = gone.read();  // "joined": it counts
    REQUIRE(got[0].type == "joined");
  }  // closed
  REQUIRE(job[0].await(
      [](const NodeView& v) {
        return v.has_info("node early (127.0.0.1) joined, then went away (connection closed); 1 of 3 nodes joined now");
      },
      kForm));
  CHECK_FALSE(job[0].view().formed);
  job.add(job.static_options(3, 1));
  job.add(job.static_options(3, 2));
  REQUIRE(job.await_all(formed, kForm));
  CHECK(job[0].view().assignment.hosts == std::vector<std::string>{"node0", "node1", "node2"});
}

// A coordinator whose SYN-ACK takes longer than a connect try (2 s one way: 4 s) was never joined:
// each try gave up after 2 s. Each timed-out connect now waits twice as long as the one before.
// The endpoint here is a listener whose accept queue is full (backlog 0, one connection never
// accepted): the kernel drops every further SYN, so every connect times out.
TEST_CASE("node group: a member's connect that times out is tried again with twice the wait",
          "[cluster][node_group][slow]") {
  LoopbackJob job;
  LoopbackListener silent(0);
  const int queued = connect_to(silent.port());  // fills the queue of one
  REQUIRE(queued >= 0);
  auto o = job.static_options(2, 1);
  o.endpoint_port = silent.port();
  o.rdzv_timeout = milliseconds(6500);
  job.add(o);
  REQUIRE(job.await_all(ended, milliseconds(6500) + kForm));
  ::close(queued);
  const NodeView v = job[0].view();
  std::string said;
  for (const auto& line : v.info) said += line + "\n";
  INFO(said << v.rendezvous_error);
  // Tries of 2 s, then 4 s: the report after the second names its 4 s; the last try has what was
  // left of the 6.5 s.
  CHECK(v.has_info("node 0 could not be reached: connect: Connection timed out (no answer in 4 s)"));
  CHECK_FALSE(v.has_info("(no answer in 8 s)"));
  CHECK(contains(v.rendezvous_error, "timed out after 6.5 s"));
  CHECK(contains(v.rendezvous_error, "connect: Connection timed out (no answer in"));
}
