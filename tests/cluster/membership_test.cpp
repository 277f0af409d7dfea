// Who is in a job and where, without sockets (cluster/membership.hpp): when the rendezvous
// forms, and the node ranks at the rendezvous and at an elastic round.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cluster/membership.hpp"

using namespace lspawn::node;
using std::chrono::milliseconds;
using V = std::vector<int>;

namespace {
const auto t0 = lspawn::sys::Clock::time_point{} + std::chrono::hours(1);
}

TEST_CASE("node ranks: the given ones kept, the others the lowest free ones in join order, coordinator first",
          "[cluster][membership]") {
  const std::vector<std::string> who = {"a (this node)", "b", "c", "d"};
  CHECK(assign_node_ranks({-1, -1, -1, -1}, who, 4).rank == V{0, 1, 2, 3});
  CHECK(assign_node_ranks({-1, 0, -1, -1}, who, 4).rank == V{1, 0, 2, 3});  // node 0 given elsewhere
  CHECK(assign_node_ranks({2, -1, 0, -1}, who, 4).rank == V{2, 1, 0, 3});
  CHECK(assign_node_ranks({3, 2, 1, 0}, who, 4).rank == V{3, 2, 1, 0});
  CHECK(assign_node_ranks({-1, -1, 1, -1}, who, 4).rank == V{0, 2, 1, 3});
  CHECK(assign_node_ranks({-1, -1, 1, -1}, who, 4).problem.empty());
}

TEST_CASE("node ranks: a rank out of range or given twice is the problem, naming the nodes", "[cluster][membership]") {
  const std::vector<std::string> who = {"a (this node)", "b", "c"};
  CHECK(assign_node_ranks({-1, 3, -1}, who, 3).problem == "b has --node-rank 3 >= --nnodes 3");
  CHECK(assign_node_ranks({1, -1, 1}, who, 3).problem == "a (this node) and c both have --node-rank 1");
}

TEST_CASE("elastic node ranks: the coordinator, then the survivors in their old order, then the new ones in join order",
          "[cluster][membership]") {
  CHECK(elastic_node_ranks({1, 2, 3}, 0) == V{1, 2, 3});
  CHECK(elastic_node_ranks({1, 3}, 0) == V{1, 2});         // node 2 was lost
  CHECK(elastic_node_ranks({3, 1}, 2) == V{2, 1, 3, 4});   // by old rank, whatever the order given
  CHECK(elastic_node_ranks({}, 2) == V{1, 2});             // only the coordinator survived
}

TEST_CASE("formation, fixed: with every node at once, else timed out at the deadline", "[cluster][membership]") {
  Formation f(3, 0, milliseconds(1000), t0 + milliseconds(5000));
  CHECK_FALSE(f.check(2, t0).formed);
  CHECK_FALSE(f.check(2, t0).timed_out);
  CHECK_FALSE(f.check(2, t0).last_call_began);
  CHECK(f.next_due() == t0 + milliseconds(5000));
  CHECK(f.check(3, t0).formed);
  const auto late = f.check(2, t0 + milliseconds(5000));
  CHECK(late.timed_out);
  CHECK_FALSE(late.formed);
  // MIN == MAX is a fixed count.
  Formation same(2, 2, milliseconds(0), t0 + milliseconds(5000));
  CHECK_FALSE(same.check(1, t0).formed);
  CHECK_FALSE(same.check(1, t0).last_call_began);
}

TEST_CASE("formation, elastic: MAX at once, or at least MIN after the last call, or at the deadline",
          "[cluster][membership]") {
  Formation f(4, 2, milliseconds(1000), t0 + milliseconds(5000));
  SECTION("MAX at once") { CHECK(f.check(4, t0).formed); }
  SECTION("MIN: the last call begins, then it forms") {
    CHECK_FALSE(f.check(1, t0).last_call_began);
    auto c = f.check(2, t0 + milliseconds(100));
    CHECK(c.last_call_began);
    CHECK_FALSE(c.formed);
    CHECK(f.next_due() == t0 + milliseconds(1100));
    c = f.check(3, t0 + milliseconds(500));  // one more: the same last call goes on
    CHECK_FALSE(c.last_call_began);
    CHECK_FALSE(c.formed);
    CHECK(f.check(3, t0 + milliseconds(1100)).formed);
  }
  SECTION("a node leaves during the last call: it ends; MIN again begins a new one") {
    CHECK(f.check(2, t0).last_call_began);
    CHECK_FALSE(f.check(1, t0 + milliseconds(500)).formed);
    CHECK_FALSE(f.last_call_end());
    CHECK_FALSE(f.check(1, t0 + milliseconds(1500)).formed);
    CHECK(f.check(2, t0 + milliseconds(1600)).last_call_began);
    CHECK_FALSE(f.check(2, t0 + milliseconds(2500)).formed);
    CHECK(f.check(2, t0 + milliseconds(2600)).formed);
  }
  SECTION("the deadline comes before the last call ends: it forms with MIN") {
    Formation g(4, 2, milliseconds(10000), t0 + milliseconds(5000));
    CHECK(g.check(2, t0 + milliseconds(4500)).last_call_began);
    CHECK(g.next_due() == t0 + milliseconds(5000));
    const auto c = g.check(2, t0 + milliseconds(5000));
    CHECK(c.formed);
    CHECK_FALSE(c.timed_out);
  }
  SECTION("fewer than MIN at the deadline: timed out") {
    const auto c = f.check(1, t0 + milliseconds(5000));
    CHECK(c.timed_out);
    CHECK_FALSE(c.formed);
  }
}
