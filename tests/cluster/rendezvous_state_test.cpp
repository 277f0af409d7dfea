// The coordinator's rendezvous as one state, without sockets (cluster/rendezvous_state.hpp): the
// state x event table, and Formation, which turns "n nodes joined at t" into its events: when the
// rendezvous forms, its last call, its timeout, and a reject.
#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "cluster/rendezvous_state.hpp"

using namespace lspawn::node;
using std::chrono::milliseconds;
using S = RdzvState;
using States = std::vector<RdzvState>;

namespace {
const auto t0 = lspawn::sys::Clock::time_point{} + std::chrono::hours(1);
}

TEST_CASE("rendezvous state: the state x event table, written once", "[cluster][rendezvous]") {
  using E = RdzvEvent;
  const std::optional<S> no;  // not acted on
  struct Row {
    S from;
    std::optional<S> to[6];  // by event: MinJoined, BelowMin, AllJoined, LastCallOver, Deadline, Reject
  };
  const std::vector<Row> rows = {
      {S::Waiting, {S::LastCall, no, S::Formed, no, S::TimedOut, S::Rejected}},
      {S::LastCall, {no, S::Waiting, S::Formed, S::Formed, S::Formed, S::Rejected}},
      {S::Formed, {no, no, no, no, no, S::Rejected}},
      {S::TimedOut, {no, no, no, no, no, no}},
      {S::Rejected, {no, no, no, no, no, no}},
  };
  const E events[] = {E::MinJoined, E::BelowMin, E::AllJoined, E::LastCallOver, E::Deadline, E::Reject};
  for (const Row& r : rows) {
    for (int e = 0; e < 6; ++e) {
      INFO(rdzv_state_name(r.from) << " + " << rdzv_event_name(events[e]));
      CHECK(next_rdzv_state(r.from, events[e]) == r.to[e]);
    }
  }
}

TEST_CASE("formation, fixed: formed with every node at once, else timed out at the deadline", "[cluster][rendezvous]") {
  Formation f(3, 0, milliseconds(1000), t0 + milliseconds(5000));
  CHECK(f.state() == S::Waiting);
  CHECK(f.gathering());
  CHECK(f.update(2, t0).empty());
  CHECK(f.next_due() == t0 + milliseconds(5000));
  CHECK(f.update(3, t0) == States{S::Formed});
  CHECK_FALSE(f.gathering());
  CHECK(f.update(2, t0 + milliseconds(5000)).empty());  // formed stays formed
  CHECK(f.state() == S::Formed);

  Formation late(3, 0, milliseconds(1000), t0 + milliseconds(5000));
  CHECK(late.update(2, t0 + milliseconds(5000)) == States{S::TimedOut});
  CHECK(late.update(3, t0 + milliseconds(5001)).empty());  // too late: it stays timed out
  CHECK(late.state() == S::TimedOut);
  CHECK_FALSE(late.reject());

  // MIN == MAX is a fixed count: no last call.
  Formation same(2, 2, milliseconds(0), t0 + milliseconds(5000));
  CHECK(same.update(1, t0).empty());
  CHECK(same.state() == S::Waiting);
  CHECK_FALSE(same.last_call_end());
}

TEST_CASE("formation, elastic: MAX at once, or at least MIN after the last call, or at the deadline",
          "[cluster][rendezvous]") {
  Formation f(4, 2, milliseconds(1000), t0 + milliseconds(5000));
  SECTION("MAX at once") { CHECK(f.update(4, t0) == States{S::Formed}); }
  SECTION("MIN: the last call begins, then it forms") {
    CHECK(f.update(1, t0).empty());
    CHECK(f.update(2, t0 + milliseconds(100)) == States{S::LastCall});
    CHECK(f.last_call_end() == t0 + milliseconds(1100));
    CHECK(f.next_due() == t0 + milliseconds(1100));
    CHECK(f.update(3, t0 + milliseconds(500)).empty());  // one more: the same last call goes on
    CHECK(f.state() == S::LastCall);
    CHECK(f.update(3, t0 + milliseconds(1099)).empty());
    CHECK(f.update(3, t0 + milliseconds(1100)) == States{S::Formed});
    CHECK_FALSE(f.last_call_end());
  }
  SECTION("MAX during the last call: formed at once") {
    CHECK(f.update(2, t0) == States{S::LastCall});
    CHECK(f.update(4, t0 + milliseconds(10)) == States{S::Formed});
  }
  SECTION("a node leaves during the last call: it ends; MIN again begins a new one") {
    CHECK(f.update(2, t0) == States{S::LastCall});
    CHECK(f.update(1, t0 + milliseconds(500)) == States{S::Waiting});
    CHECK_FALSE(f.last_call_end());
    CHECK(f.next_due() == t0 + milliseconds(5000));
    CHECK(f.update(1, t0 + milliseconds(1500)).empty());
    CHECK(f.update(2, t0 + milliseconds(1600)) == States{S::LastCall});
    CHECK(f.update(2, t0 + milliseconds(2500)).empty());
    CHECK(f.update(2, t0 + milliseconds(2600)) == States{S::Formed});
  }
  SECTION("the deadline comes before the last call ends: it forms with MIN") {
    Formation g(4, 2, milliseconds(10000), t0 + milliseconds(5000));
    CHECK(g.update(2, t0 + milliseconds(4500)) == States{S::LastCall});
    CHECK(g.next_due() == t0 + milliseconds(5000));
    CHECK(g.update(2, t0 + milliseconds(5000)) == States{S::Formed});
  }
  SECTION("MIN joins at the deadline: the last call begins and it forms at once (both said)") {
    CHECK(f.update(2, t0 + milliseconds(5000)) == States{S::LastCall, S::Formed});
  }
  SECTION("a zero last call: MIN forms at once, the last call said") {
    Formation g(4, 2, milliseconds(0), t0 + milliseconds(5000));
    CHECK(g.update(2, t0) == States{S::LastCall, S::Formed});
  }
  SECTION("fewer than MIN at the deadline: timed out") {
    CHECK(f.update(1, t0 + milliseconds(5000)) == States{S::TimedOut});
    CHECK_FALSE(f.gathering());
  }
}

TEST_CASE("formation: a reject ends it, also after it formed (node ranks clash), never after a timeout",
          "[cluster][rendezvous]") {
  Formation waiting(3, 0, milliseconds(0), t0 + milliseconds(5000));
  CHECK(waiting.reject());
  CHECK(waiting.state() == S::Rejected);
  CHECK(waiting.update(3, t0).empty());

  Formation last_call(4, 2, milliseconds(1000), t0 + milliseconds(5000));
  last_call.update(2, t0);
  CHECK(last_call.reject());
  CHECK(last_call.state() == S::Rejected);
  CHECK_FALSE(last_call.last_call_end());

  Formation formed(2, 0, milliseconds(0), t0 + milliseconds(5000));
  formed.update(2, t0);
  CHECK(formed.reject());
  CHECK(formed.state() == S::Rejected);
  CHECK_FALSE(formed.reject());
}
