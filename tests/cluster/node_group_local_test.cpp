// This node's side of a round, as the node group keeps it (cluster/node_group.hpp): the launcher's
// reports (local_failure, local_done, the hang) once per round, starting over with the round
// take_start() hands out. A one-node group: no channel, the same round protocol; its workers'
// port is reserved on loopback (port 0).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cluster/node_group.hpp"

using namespace lspawn::node;

namespace {

NodeGroupOptions one_node(int max_restarts, std::vector<std::string>* said) {
  NodeGroupOptions o;
  o.endpoint_addr = "127.0.0.1";
  o.nnodes = 1;
  o.max_restarts = max_restarts;
  o.host = "solo";
  o.info = [said](const std::string& l) { said->push_back(l); };
  return o;
}

Cause worker_failure(int round, int exit_code) {
  Cause c;
  c.kind = CauseKind::Worker;
  c.restart_count = round;
  c.rank = 0;
  c.node_rank = 0;
  c.host = "solo";
  c.exit_code = exit_code;
  c.time_us = 1;
  c.text = "lspawn: root cause: process 0 terminated with exit code " + std::to_string(exit_code) + "\n";
  return c;
}

}  // namespace

TEST_CASE("node group: local_failure acts on the round's first failure, local_done once per round",
          "[cluster][node_group]") {
  std::vector<std::string> said;
  auto g = NodeGroup::form(one_node(1, &said), 0);
  REQUIRE(g->coordinator());
  CHECK(g->round() == 0);
  CHECK(g->assignment().master_port > 0);
  CHECK_FALSE(g->stop_requested());
  CHECK_FALSE(g->local_failure_sent());
  CHECK_FALSE(g->hang());

  g->set_hang();
  CHECK(g->local_failure(worker_failure(0, 3)));
  CHECK(g->local_failure_sent());
  CHECK(g->stop_requested());
  CHECK_FALSE(g->local_failure(worker_failure(0, 4)));  // a later failure of the same round: ignored
  CHECK_FALSE(g->take_start());                         // nothing decided yet: not every node is done

  CHECK(g->local_done(true, worker_failure(0, 3)));
  CHECK(g->local_done_sent());
  CHECK_FALSE(g->local_done(true, worker_failure(0, 3)));  // once per round
  CHECK_FALSE(g->finish());                                // one restart left: restarting
  // Until the next round is handed out, this round's reports stand (the launcher's loop asks
  // again before it takes the start).
  CHECK(g->local_failure_sent());
  CHECK(g->hang());

  const auto next = g->take_start();
  REQUIRE(next);
  CHECK(*next == 1);
  CHECK(g->round() == 1);
  CHECK(g->restarts_used() == 1);
  CHECK(g->failed_attempts().size() == 1);
  CHECK_FALSE(g->stop_requested());
  CHECK_FALSE(g->local_failure_sent());
  CHECK_FALSE(g->local_done_sent());
  CHECK_FALSE(g->hang());
  CHECK_FALSE(g->take_start());  // once

  // Round 1 fails too: no restart left, the job ends with the first report's exit code.
  CHECK(g->local_failure(worker_failure(1, 5)));
  CHECK(g->local_done(true, worker_failure(1, 5)));
  REQUIRE(g->finish());
  CHECK(g->finish()->exit_code == 5);
  CHECK_FALSE(g->take_start());
  CHECK_FALSE(g->local_failure(worker_failure(1, 6)));
}

TEST_CASE("node group: a round that succeeds finishes the job with exit code 0", "[cluster][node_group]") {
  std::vector<std::string> said;
  auto g = NodeGroup::form(one_node(2, &said), 0);
  CHECK(g->next_wakeup() == Clock::time_point::max());  // no links: nothing to keep up
  CHECK(g->local_done(false, Cause{}));
  REQUIRE(g->finish());
  CHECK(g->finish()->exit_code == 0);
  CHECK(g->restarts_used() == 0);
  CHECK_FALSE(g->take_start());
}
