// The coordinator's rendezvous (rendezvous.hpp) as one state and the rules that move it, in the
// style of round.hpp: the state x event table, and Formation, which turns "n nodes have joined
// at time t" into those events and is the state's one writer. Pure: no sockets; the clock is
// passed in (tests/cluster/rendezvous_state_test.cpp).
//
//               MinJoined  BelowMin  AllJoined  LastCallOver  Deadline  Reject
//   Waiting     LastCall   -         Formed     -             TimedOut  Rejected
//   LastCall    -          Waiting   Formed     Formed        Formed    Rejected
//   Formed      -          -         -          -             -         Rejected
//   TimedOut    -          -         -          -             -         -
//   Rejected    -          -         -          -             -         -
//
// (-: the event changes nothing.)
// MinJoined: an elastic job (--nnodes MIN:MAX, MIN < MAX) has at least MIN nodes (the
// coordinator included); the last call (--last-call, GroupOptions::last_call) begins. BelowMin: a
// node left during the last call, leaving fewer than MIN: the last call ends (a new one begins
// when MIN have joined again). AllJoined: MAX (a fixed job: --nnodes) have joined.
// LastCallOver: the last call has run its time. Deadline: --rdzv-timeout has passed. Reject: the
// coordinator turns every node away (a node disagrees on the job; after Formed: node ranks clash,
// node 0 reserved no port for the workers).
// Formed: the nodes are known; the coordinator numbers them and sends each its assignment.
// TimedOut: fewer than MIN (fixed: --nnodes) came by the deadline; every connection is rejected.
//
// A member's side of the rendezvous has no table of its own: it tries to host or join until the
// coordinator answers, then waits for its assignment (Formed), a reject (Rejected) or the deadline
// (TimedOut) (rendezvous.cpp).
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "sys/sys.hpp"

namespace lspawn::node {

enum class RdzvState {
  Waiting,   // fewer than MIN (fixed: --nnodes) have joined
  LastCall,  // elastic: at least MIN have joined; waiting for more until the last call ends
  Formed,    // the job's nodes are known
  TimedOut,  // the deadline passed with too few nodes
  Rejected,  // the coordinator turned every node away
};
const char* rdzv_state_name(RdzvState s);

enum class RdzvEvent { MinJoined, BelowMin, AllJoined, LastCallOver, Deadline, Reject };
const char* rdzv_event_name(RdzvEvent e);

// The table above: the state after `e` in `s`, or nullopt where the table says "-".
std::optional<RdzvState> next_rdzv_state(RdzvState s, RdzvEvent e);

// When the coordinator's rendezvous forms: with `nnodes` (MAX) nodes at once; elastic (MIN <
// MAX), with at least MIN once `last_call` has passed since MIN had joined, or at the deadline.
// Fewer than that at the deadline: it timed out. The state changes through enter() only.
class Formation {
 public:
  using time_point = sys::Clock::time_point;
  Formation(int nnodes, int min_nnodes, std::chrono::milliseconds last_call, time_point deadline);

  RdzvState state() const { return state_; }
  // With `joined` nodes (the coordinator included) at `now`: the events this makes, in the
  // table's order. Returns the states entered, in order (empty: no change), so that a caller
  // says "the last call began" even when the job forms at the same moment.
  std::vector<RdzvState> update(int joined, time_point now);
  // Every node is turned away (Waiting, LastCall, Formed: Rejected). False: already over.
  bool reject() { return enter(RdzvEvent::Reject, time_point{}); }
  // Waiting or LastCall: the job has not formed, nor failed.
  bool gathering() const { return state_ == RdzvState::Waiting || state_ == RdzvState::LastCall; }
  // The next time update() may change the state without a node joining or leaving.
  time_point next_due() const;
  // LastCall: when the last call ends.
  std::optional<time_point> last_call_end() const { return last_call_end_; }

 private:
  // The one writer of state_ (and of last_call_end_, which LastCall carries): false where the
  // table says "-".
  bool enter(RdzvEvent e, time_point now);

  int nnodes_;
  int min_nnodes_;  // 0: a fixed count
  std::chrono::milliseconds last_call_;
  time_point deadline_;
  RdzvState state_ = RdzvState::Waiting;
  std::optional<time_point> last_call_end_;  // set while LastCall
};

}  // namespace lspawn::node
