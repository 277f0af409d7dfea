// Who is in a job and where, without sockets (cluster/membership.hpp): the node ranks at the
// rendezvous and at an elastic round. (When the rendezvous forms: rendezvous_state_test.cpp.)
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cluster/membership.hpp"

using namespace lspawn::node;
using V = std::vector<int>;

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
  CHECK(elastic_node_ranks({1, 3}, 0) == V{1, 2});        // node 2 was lost
  CHECK(elastic_node_ranks({3, 1}, 2) == V{2, 1, 3, 4});  // by old rank, whatever the order given
  CHECK(elastic_node_ranks({}, 2) == V{1, 2});            // only the coordinator survived
}
