// Who is in a job and in which place (rendezvous.hpp, admission.hpp): the node ranks at the
// rendezvous and at each elastic round. Pure: no sockets (tests/cluster/membership_test.cpp).
// When the rendezvous forms is rendezvous_state.hpp's.
#pragma once

#include <string>
#include <vector>

namespace lspawn::node {

// Node ranks at the rendezvous. `given[i]`: node i's --node-rank or -1 (i = 0: the coordinator,
// then the others in join order); `who[i]` names it in a problem. The given ranks are kept, the
// others take the lowest free ranks in that order (so the coordinator is node 0 unless told
// otherwise).
struct NodeRanks {
  std::vector<int> rank;  // by i, when problem is empty
  std::string problem;    // "B has --node-rank 5 >= --nnodes 2", "A and B both have --node-rank 1"
};
NodeRanks assign_node_ranks(const std::vector<int>& given, const std::vector<std::string>& who, int nnodes);

// An elastic job's next round: the coordinator is node 0, then the members still there by their
// old node rank, then `admitted` new nodes in join order. Returns the new rank of each survivor
// (in the order of `survivor_ranks`, their old ranks), then of each admitted node.
std::vector<int> elastic_node_ranks(const std::vector<int>& survivor_ranks, int admitted);

}  // namespace lspawn::node
