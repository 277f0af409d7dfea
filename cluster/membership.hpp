// Who is in a job and in which place (node_group.hpp's rendezvous and elastic rounds): when the
// rendezvous forms, and the node ranks at the rendezvous and at each elastic round. Pure: no
// sockets; the clock is passed in (tests/cluster/membership_test.cpp).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "sys/sys.hpp"

namespace lspawn::node {

// When the coordinator's rendezvous forms: with `nnodes` (MAX) nodes at once; elastic (MIN <
// MAX), with at least MIN once `last_call` has passed since MIN had joined, or at the deadline.
// Fewer than that at the deadline: it timed out. A node that leaves while the last call runs,
// leaving fewer than MIN, ends the last call (a new one begins when MIN have joined again).
class Formation {
 public:
  using time_point = sys::Clock::time_point;
  Formation(int nnodes, int min_nnodes, std::chrono::milliseconds last_call, time_point deadline);

  struct Check {
    bool formed = false;
    bool timed_out = false;        // not formed, and the deadline has passed
    bool last_call_began = false;  // MIN joined just now: the last call runs until last_call_end()
  };
  // With `joined` nodes (the coordinator included) at `now`.
  Check check(int joined, time_point now);
  // The next time check() may change its answer without a node joining.
  time_point next_due() const;
  std::optional<time_point> last_call_end() const { return last_call_end_; }

 private:
  int nnodes_;
  int min_nnodes_;  // 0: a fixed count
  std::chrono::milliseconds last_call_;
  time_point deadline_;
  std::optional<time_point> last_call_end_;  // set while at least MIN have joined
};

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
