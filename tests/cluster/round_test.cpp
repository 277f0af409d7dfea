// The node group's round rules without sockets (cluster/round.hpp): the state x event table,
// the root cause of a round, and what the coordinator decides when every node is done.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cluster/round.hpp"

using namespace lspawn::node;

namespace {

Cause cause(const std::string& kind, int64_t time_us, int exit_code = 1, int node_rank = 0) {
  Cause c;
  c.kind = lspawn::proto::parse_cause_kind(kind).value();  // a name no kind has throws
  c.time_us = time_us;
  c.exit_code = exit_code;
  c.node_rank = node_rank;
  c.text = "lspawn: root cause: " + kind + "\n";
  return c;
}

RoundFacts facts(std::vector<Cause> causes) {
  RoundFacts f;
  f.round = 2;
  f.causes = std::move(causes);
  f.max_restarts = 3;
  f.next_nodes = 2;
  return f;
}

}  // namespace

TEST_CASE("round state: the state x event table, written once", "[cluster][round]") {
  using S = RoundState;
  using E = RoundEvent;
  struct Row {
    S from;
    E event;
    std::optional<S> to;  // nullopt: not acted on
  };
  const std::vector<Row> rows = {
      {S::Running, E::Failure, S::Stopping},     {S::Running, E::Restart, S::Restarting},
      {S::Running, E::Start, S::Running},        {S::Running, E::Finish, S::Finished},
      {S::Stopping, E::Failure, std::nullopt},   {S::Stopping, E::Restart, S::Restarting},
      {S::Stopping, E::Start, S::Running},       {S::Stopping, E::Finish, S::Finished},
      {S::Restarting, E::Failure, std::nullopt}, {S::Restarting, E::Restart, std::nullopt},
      {S::Restarting, E::Start, S::Running},     {S::Restarting, E::Finish, S::Finished},
      {S::Finished, E::Failure, std::nullopt},   {S::Finished, E::Restart, std::nullopt},
      {S::Finished, E::Start, std::nullopt},     {S::Finished, E::Finish, std::nullopt},
  };
  for (const Row& r : rows) {
    INFO(round_state_name(r.from) << " + event " << static_cast<int>(r.event));
    CHECK(next_round_state(r.from, r.event) == r.to);
  }
}

TEST_CASE("root cause: a lost node, then a signal, then a joining node, then the earliest failure by time",
          "[cluster][round]") {
  const Cause late_worker = cause("worker", 300), early_worker = cause("worker", 100), hang = cause("hang", 200);
  const Cause signal = cause("signal", 400, 143), lost = cause("node-lost", 500, 123),
              joined = cause("membership", 50, 0);
  CHECK(root_cause({late_worker, early_worker, hang}).time_us == 100);  // earliest, whatever came first
  CHECK(root_cause({late_worker, hang}).kind == CauseKind::Hang);
  CHECK(root_cause({early_worker, signal}).kind == CauseKind::Signal);  // later, but more fundamental
  CHECK(root_cause({early_worker, signal, lost}).kind == CauseKind::NodeLost);
  CHECK(root_cause({early_worker, joined}).kind == CauseKind::Membership);
  CHECK(root_cause({joined, signal}).kind == CauseKind::Signal);
  // Two of a kind: the earlier.
  CHECK(root_cause({cause("node-lost", 9, 123, 2), cause("node-lost", 8, 123, 1)}).node_rank == 1);
}

TEST_CASE("round decision: no failure finishes with 0", "[cluster][round]") {
  const RoundDecision d = decide_round(facts({}));
  REQUIRE(d.finish);
  CHECK_FALSE(d.restart);
  CHECK(d.finish->exit_code == 0);
  CHECK_FALSE(d.finish->failed);
  CHECK(d.finish->restart_count == 2);
}

TEST_CASE("round decision: a worker failure with restarts left restarts every node, counted", "[cluster][round]") {
  RoundFacts f = facts({cause("worker", 200, 7), cause("worker", 100, 5)});
  RoundDecision d = decide_round(f);
  REQUIRE(d.restart);
  CHECK_FALSE(d.finish);
  CHECK(d.restart->exit_code == 5);  // the earliest
  CHECK(d.counted);
  CHECK_FALSE(d.survivors);
  SECTION("no restart left: finish with the root cause's exit code") {
    f.restarts_used = 3;
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->exit_code == 5);
    CHECK(d.finish->failed);
    CHECK(d.finish->restart_count == 2);
  }
  SECTION("a hang is not restarted") {
    f.causes = {cause("hang", 100, 124)};
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->exit_code == 124);
  }
}

TEST_CASE("round decision: an exit code of --no-restart-exit-codes is not retried, and the report says why",
          "[cluster][round]") {
  RoundFacts f = facts({cause("worker", 100, 2)});
  f.no_restart_codes = {2, 3};
  RoundDecision d = decide_round(f);
  REQUIRE(d.finish);
  CHECK_FALSE(d.restart);
  CHECK(d.finish->exit_code == 2);
  CHECK(d.finish->cause.text.find(
            "lspawn:   not restarted (3 restarts left): exit code 2 is one of --no-restart-exit-codes 2,3\n") !=
        std::string::npos);
  // Another code: restarted as before.
  f.causes = {cause("worker", 100, 4)};
  d = decide_round(f);
  CHECK(d.restart);
  // No restart left anyway: nothing about the codes.
  f.causes = {cause("worker", 100, 3)};
  f.restarts_used = 3;
  d = decide_round(f);
  REQUIRE(d.finish);
  CHECK(d.finish->cause.text.find("not restarted") == std::string::npos);
  // A hang's 124 or a lost node are not worker exits: the codes do not apply.
  f.restarts_used = 0;
  f.no_restart_codes = {124};
  f.causes = {cause("hang", 100, 124)};
  d = decide_round(f);
  REQUIRE(d.finish);
  CHECK(d.finish->cause.text.find("not restarted") == std::string::npos);
}

TEST_CASE("round decision: a worker that failed before its rendezvous is not restarted, and the report says why",
          "[cluster][round]") {
  Cause early = cause("worker", 100, 1);
  early.rank = 5;
  early.before_rendezvous = true;
  RoundFacts f = facts({early});
  RoundDecision d = decide_round(f);
  REQUIRE(d.finish);
  CHECK_FALSE(d.restart);
  CHECK(d.finish->exit_code == 1);
  CHECK(d.finish->cause.text.find("lspawn:   not restarted (3 restarts left): rank 5 failed before it reached its "
                                  "rendezvous (init_process_group): the next attempt would fail the same way\n") !=
        std::string::npos);
  // The root cause decides: an earlier failure after the rendezvous is restarted.
  Cause late = cause("worker", 50, 1);
  f.causes = {early, late};
  CHECK(decide_round(f).restart);
  // Unknown (no marker: before_rendezvous false): restarted as before.
  early.before_rendezvous = false;
  f.causes = {early};
  CHECK(decide_round(f).restart);
  // No restart left: the usual finish, nothing about the rendezvous.
  early.before_rendezvous = true;
  f.causes = {early};
  f.restarts_used = 3;
  d = decide_round(f);
  REQUIRE(d.finish);
  CHECK(d.finish->cause.text.find("not restarted") == std::string::npos);
}

TEST_CASE("attempt_failed_text: one attempt's end for the job's summary", "[cluster][round]") {
  Cause c = cause("worker", 1, 3, 1);
  c.host = "mn-b";
  c.text = "lspawn: root cause: process 3 terminated with exit code 3\nlspawn:   rank 3 of 4\n";
  CHECK(attempt_failed_text(0, c) == "attempt 0 failed (process 3 terminated with exit code 3 on node 1 (mn-b))");
  Cause lost = cause("node-lost", 1, 123, 1);
  lost.text = "lspawn: root cause: node 1 (mn-b, 10.0.0.2) was lost\n";
  CHECK(attempt_failed_text(2, lost) == "attempt 2 failed (node 1 (mn-b, 10.0.0.2) was lost)");
}

TEST_CASE("round decision: a lost node or a signal finishes a fixed job, whatever restarts are left",
          "[cluster][round]") {
  RoundFacts f = facts({cause("worker", 100, 5), cause("node-lost", 200, 123)});
  f.any_lost = true;
  RoundDecision d = decide_round(f);
  REQUIRE(d.finish);
  CHECK(d.finish->exit_code == 123);
  CHECK(d.finish->cause.kind == CauseKind::NodeLost);
  SECTION("a worker failure in a round that also lost a node") {
    f.causes = {cause("worker", 100, 5)};  // the lost node's cause already dropped: still no restart
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->exit_code == 5);
  }
  SECTION("a signal") {
    f.any_lost = false;
    f.causes = {cause("worker", 100, 5), cause("signal", 200, 143)};
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->exit_code == 143);
  }
}

TEST_CASE("round decision, elastic: a lost node with restarts left and MIN nodes left restarts the survivors",
          "[cluster][round]") {
  RoundFacts f = facts({cause("node-lost", 200, 123), cause("worker", 100, 1)});
  f.elastic = true;
  f.min_nnodes = 2;
  f.nnodes_flag = "2:3";
  f.any_lost = true;
  f.next_nodes = 2;
  RoundDecision d = decide_round(f);
  REQUIRE(d.restart);
  CHECK(d.restart->kind == CauseKind::NodeLost);
  CHECK(d.counted);
  CHECK(d.survivors);
  SECTION("fewer than MIN left: finish, and the report says why") {
    f.next_nodes = 1;
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->exit_code == 123);
    CHECK(d.finish->cause.text ==
          "lspawn: root cause: node-lost\nlspawn:   1 node left, fewer than the 2 of --nnodes 2:3\n");
  }
  SECTION("no restart left: finish, no word about MIN") {
    f.restarts_used = 3;
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->cause.text == "lspawn: root cause: node-lost\n");
  }
  SECTION("a signal as well: finish") {
    f.causes.push_back(cause("signal", 300, 143));
    d = decide_round(f);
    REQUIRE(d.finish);
    CHECK(d.finish->exit_code == 123);
  }
}

TEST_CASE("round decision, elastic: a node that joined restarts without using a restart", "[cluster][round]") {
  RoundFacts f = facts({cause("membership", 100, 0), cause("worker", 150, 1)});
  f.elastic = true;
  f.restarts_used = 3;  // none left: a new node is admitted all the same
  const RoundDecision d = decide_round(f);
  REQUIRE(d.restart);
  CHECK(d.restart->kind == CauseKind::Membership);
  CHECK_FALSE(d.counted);
}

TEST_CASE("a node lost after the decision: a fixed job ends, an elastic one goes on with MIN nodes",
          "[cluster][round]") {
  const std::vector<Cause> causes = {cause("worker", 100, 5), cause("node-lost", 200, 123, 1)};
  auto fixed = lost_since_decision(causes, false, 3, 0);
  REQUIRE(fixed);
  CHECK(fixed->node_rank == 1);
  CHECK_FALSE(lost_since_decision(causes, true, 2, 2));
  CHECK(lost_since_decision(causes, true, 1, 2));
  CHECK_FALSE(lost_since_decision({cause("worker", 100, 5)}, false, 3, 0));
  const FinishMsg f = failed_finish(*fixed, 4);
  CHECK(f.failed);
  CHECK(f.exit_code == 123);
  CHECK(f.restart_count == 4);
}
