// A job's round (node_group.hpp's round protocol) as one state and the rules that move it: the
// state x event table, the root cause of a round, and what the coordinator decides when every
// node is done. Pure: no sockets, no clock; the node group feeds it events and sends the
// messages (tests/cluster/round_test.cpp).
//
//                 Failure      Restart      Start     Finish
//   Running       Stopping     Restarting   Running   Finished
//   Stopping      -            Restarting   Running   Finished
//   Restarting    -            -            Running   Finished
//   Finished      -            -            -         -
//
// (-: the event changes nothing and is not acted on; its facts, a failure's cause, are still
// recorded by the group.)
// Failure: a worker failed anywhere, a signal to an lspawn, a node lost, a node joined an
// elastic job (the coordinator sends StopMsg when Running becomes Stopping; a member stops its
// workers). Restart: the coordinator, every node done, decided a next round (decide_round()).
// Start: the next round begins (coordinator: take_start(); member: StartMsg). Finish: the job
// is over (coordinator: decided; member: FinishMsg, or the coordinator lost and its own workers
// done).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cluster/node_channel.hpp"

namespace lspawn::node {

enum class RoundState {
  Running,     // this round's workers run; no failure known
  Stopping,    // a failure is known: this round's workers stop everywhere
  Restarting,  // coordinator: every node is done and the next round is decided, not begun yet
  Finished,    // the job is over: its exit code and root cause are settled
};
const char* round_state_name(RoundState s);

enum class RoundEvent { Failure, Restart, Start, Finish };

// The table above: the state after `e` in `s`, or nullopt where the table says "-".
std::optional<RoundState> next_round_state(RoundState s, RoundEvent e);

// The root cause among a round's failures (not empty): a lost node, then a signal to an lspawn,
// then a node that joined (elastic: it explains the workers that failed while the round
// stopped), then the earliest failure (by its time) of the rest (worker, hang).
const Cause& root_cause(const std::vector<Cause>& causes);

// What the coordinator knows when every node of the round is done.
struct RoundFacts {
  int round = 0;              // the round that ended
  std::vector<Cause> causes;  // the round's failures (empty: it succeeded)
  int restarts_used = 0;      // of max_restarts, so far
  int max_restarts = 0;
  bool elastic = false;               // --nnodes MIN:MAX with MIN < MAX
  int min_nnodes = 0;                 // MIN (elastic)
  std::string nnodes_flag;            // "2:3", for the report
  int next_nodes = 0;                 // nodes a next round would have (alive + waiting to join)
  bool any_lost = false;              // a node of the round was lost
  std::vector<int> no_restart_codes;  // --no-restart-exit-codes: a worker exiting so is not retried
};

// What the coordinator does next: finish the job (finish) or start round + 1 (restart).
struct RoundDecision {
  std::optional<FinishMsg> finish;  // exit code 0 when the round succeeded, else the root cause's
  std::optional<Cause> restart;     // the root cause of the attempt that failed
  bool counted = true;              // the restart uses one of --max-restarts (false: a node joined)
  bool survivors = false;           // elastic: the next round runs without a lost node
};

// No failure: finish 0. A node joined (elastic): restart, not counted. A worker failure with
// restarts left, no node lost, an exit code not among no_restart_codes and not before its
// rendezvous (Cause::before_rendezvous): restart (else finish, the report saying why it was not
// retried). Elastic, a lost node with restarts left, no signal
// and at least MIN nodes for the next round: restart on the survivors. Otherwise finish with the
// root cause's exit code (elastic, too few nodes left: the report says so).
RoundDecision decide_round(const RoundFacts& f);

// How the line decide_round() adds to the root cause's report of an exit code it does not retry
// begins; a one-node run, which prints its own supervisor's summary, prints that line after it.
inline constexpr const char* kNotRestartedLine = "lspawn:   not restarted (";

// "attempt 0 failed (process 1 terminated with exit code 3 on node 1 (mn-b))": one attempt's end
// for the job's summary of its attempts (Group::failed_attempts()).
std::string attempt_failed_text(int round, const Cause& c);

// The job's end in `round` with root cause `c` (its exit code).
FinishMsg failed_finish(const Cause& c, int round);

// Before a decided restart begins: the failure that ends the job after all, a node lost since
// the decision (a fixed job cannot go on without it; an elastic one can, with at least MIN nodes).
std::optional<Cause> lost_since_decision(const std::vector<Cause>& causes, bool elastic, int next_nodes,
                                         int min_nnodes);

}  // namespace lspawn::node
