// The lspawn processes of one job, one per node, as one group: rendezvous, then one fate per
// round (docs/multi-node.md). NodeGroup is the round driver; its parts, one concern each:
//   rendezvous.hpp        how the nodes meet (form() runs it), its state in rendezvous_state.hpp
//   admission.hpp         an elastic job's nodes that join after it formed
//   links.hpp             the connections to the other nodes: heartbeats, node timeouts, writes
//   round.hpp             the round's state x event table and the coordinator's decision (pure)
//   membership.hpp        node ranks at the rendezvous and at each elastic round (pure)
//   node_group_options.hpp  what the group is told (NodeGroupOptions)
// (Named NodeGroup, not Group: lspawn::Group is the collectives' group of ranks.)
//
// Round protocol (one RoundState, round.hpp: the state x event table; the coordinator's, and
// each member's copy, moved by the coordinator's messages; enter() is its one writer):
//   Running ──a worker failed anywhere (FailedMsg / local_failure), a signal, a node was lost,
//     or a node joined an elastic job──► Stopping (StopMsg to every node: grace period, then
//     SIGKILL)
//   Running/Stopping ──every node sent DoneMsg (or was lost)──► decide_round():
//     no failure                                           → FinishMsg{0}, Finished
//     a worker failure, restarts left, no node lost/signal → Restarting; take_start() sends
//                                                            StartMsg{round + 1}, Running
//     otherwise                                            → FinishMsg{root cause's exit code}
// The root cause of a round is the first of: a lost node, a signal to an lspawn, the earliest
// worker failure (by its failure time) over every node.
// A member that loses the coordinator stops its workers (Stopping) and, once they have exited,
// finishes on its own with the coordinator's node as the lost one. A node is lost when its
// connection breaks (EOF: its lspawn died) or nothing came from it for the node timeout
// (heartbeats every min(1 s, timeout / 4); TCP_USER_TIMEOUT and keepalive at the same timeout;
// links.hpp).
//
// This node's side of a round (what the launcher reports, once each per round; the round is the
// one take_start() last handed out, or the first): local_failure() (the first failure; later
// calls are ignored), local_done() (every local worker exited), hang() (this node's hang
// watchdog stopped its workers). They reset when take_start() hands out the next round.
//
// Rounds are fenced (docs/security.md, "Rounds"): in a multi-node job whose node 0 is the
// coordinator, every round's workers get a store port (MASTER_PORT) of their own, reserved by
// node 0 when the round begins and sent in StartMsg / AssignMsg; the previous round's stays
// reserved, never listening, until the next round begins. (The workers' records and gloo tokens are
// signed with a key of their round: runtime/record_auth.hpp.)
//
// Elastic jobs (--nnodes MIN:MAX, rendezvous mode; docs/multi-node.md "Elastic jobs"): the
// rendezvous forms with MAX nodes, or with at least MIN once last_call has passed since MIN
// joined (or at the rendezvous timeout); the coordinator is node 0 and keeps listening
// (admission.hpp). Each round may change the nodes: a lost node ends the round and, with restarts
// left and at least MIN nodes remaining, the next round runs on the survivors (a restart, as
// under torchrun); a node that joins while every node runs stops the round and the next round
// admits it (not a restart). Before such a round every node gets a new AssignMsg (node ranks
// 0..n-1: the coordinator, then the others in their old order, then the new ones in join order).
//
// nnodes == 1: no channel at all; the same round protocol runs locally (restarts of a
// single-node job).
// Thread-safety: none; one thread drives it (the CLI's loop).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/admission.hpp"
#include "cluster/links.hpp"
#include "cluster/node_channel.hpp"
#include "cluster/node_group_options.hpp"
#include "cluster/rendezvous.hpp"
#include "cluster/round.hpp"
#include "supervisor/port.hpp"
#include "sys/epoll.hpp"

namespace lspawn::node {

class NodeGroup {
 public:
  // Blocks until the job's nodes have met (rendezvous.hpp; throws NodeRendezvousError, or
  // PortError when the static coordinator cannot listen on --master-port). nnodes == 1: returns
  // at once. solo_master_port: nnodes == 1 only, the workers' MASTER_PORT (0: a free one).
  static std::unique_ptr<NodeGroup> form(const NodeGroupOptions& opts, int solo_master_port = 0);
  ~NodeGroup();
  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  // This round's assignment (the same object for the whole job; an elastic job changes it
  // between rounds: node rank, node count, hosts).
  const AssignMsg& assignment() const { return assign_; }
  bool coordinator() const { return coordinator_; }
  int round() const { return round_; }
  // Rounds started after a failure, of --max-restarts (a round that admits a node is none).
  int restarts_used() const { return restarts_used_; }
  // The attempts that failed and were restarted, in order, one line each: "attempt 0 failed
  // (process 1 terminated with exit code 3 on node 1 (mn-b))" (a round that admitted a node is
  // none). The job's end summary lists them (launcher/run.cpp).
  const std::vector<std::string>& failed_attempts() const { return failed_attempts_; }
  bool elastic() const;  // --nnodes MIN:MAX with MIN < MAX
  // heartbeat_interval() and status_interval() (links.hpp), for this round's node count.
  std::chrono::milliseconds heartbeat_interval() const;
  std::chrono::milliseconds status_interval() const;

  // The one fd to watch for the channel (POLLIN), the same for the whole job: an epoll set,
  // readable while any node's link (or an elastic job's endpoint) has input, so a wake-up costs
  // the same with 4 nodes or 4,096.
  int fd() const { return links_->fd(); }
  // Handles what is ready on the channel (up to kReadyPerCall links; the rest stay readable).
  void on_readable();
  // Heartbeats, node timeouts, pending writes: a sweep over every node when one is due (a
  // quarter of the heartbeat interval; 10 ms after a partial write), else nothing. Call at least
  // at next_wakeup().
  void tick();
  Clock::time_point next_wakeup() const;
  // Polls the channel's fds and `extra_fd` (>= 0) until one is readable or `deadline`; handles
  // the channel's. Returns true when extra_fd is readable. For use while no worker runs.
  bool wait(Clock::time_point deadline, int extra_fd);

  // This node's workers: the first failure of the round (provisional root cause; the round
  // stops everywhere). Returns true for the round's first call, which is acted on; later calls
  // of the same round change nothing.
  bool local_failure(const Cause& cause);
  // Whether local_failure() was called in this round.
  bool local_failure_sent() const { return local_.failure_sent; }
  // The round's end on this node (every local worker exited; failed: the settled local root
  // cause). Once per round: returns true for the call acted on, false for a repeat.
  bool local_done(bool failed, const Cause& cause);
  // Whether local_done() was called in this round.
  bool local_done_sent() const { return local_.done_sent; }
  // This node's hang watchdog stopped its workers in this round (the launcher says so when it
  // does; its local failure is then the hang, and so is a one-node job's exit code).
  void set_hang() { local_.hang = true; }
  bool hang() const { return local_.hang; }

  // This round's workers must stop (a failure or a lost node elsewhere).
  bool stop_requested() const { return state_ != RoundState::Running; }
  // A new round was decided: the round to start now (once). On the coordinator this is where
  // the round begins (an elastic job's nodes are renumbered, the others told): call it outside
  // of the group's own callbacks. This node's side of the round (local_failure_sent(),
  // local_done_sent(), hang()) starts over with it.
  std::optional<int> take_start();
  // The job is over: its exit code and root cause (the same on every node).
  const std::optional<FinishMsg>& finish() const { return finish_; }
  // This lspawn is about to block up to `limit` without heartbeats (starting an exec'd
  // forkserver): the other nodes do not count that silence. Its next message ends it.
  void announce_busy(std::chrono::milliseconds limit);
  // Hang diagnosis across nodes: sends a message to node `node_rank` (a member: only the
  // coordinator's node is reachable). To a lost or unknown node: dropped.
  void send_hang_message(int node_rank, const std::string& type, const Body& body);
  // Before exiting: gives the messages still queued up to `limit` to leave.
  void flush_for(std::chrono::milliseconds limit);

 private:
  struct Restart {  // decided by maybe_decide(), begun by take_start()
    Cause cause;
    bool counted = true;  // a restart of --max-restarts (false: a node is admitted)
  };
  // What the launcher reported for its round (the header's "this node's side of a round").
  struct LocalRound {
    bool failure_sent = false;
    bool done_sent = false;
    bool hang = false;
  };
  static constexpr int kReadyPerCall = 512;

  NodeGroup(const NodeGroupOptions& o, FormedJob job);
  // The round state's one way to change (round.hpp's table); false: the event is not acted on.
  bool enter(RoundEvent e);
  Links::Lost lost_fn();
  void read_node(NodeLink& n);
  void handle(NodeLink& n, const Message& m);
  void handle_member_message(const Message& m);
  void on_stop(const StopMsg& s);
  void on_start(const StartMsg& st);
  void on_admitted(const Admission::Admitted& a);
  void lost(NodeLink& n, const std::string& why);
  void coordinator_failure(const Cause& c);
  void node_done(int node_rank, bool failed, const Cause& c);
  void maybe_decide();
  void say_restart(const RoundDecision& d) const;
  void begin_round();
  void fence_master_port();
  void send_round(const Cause& cause, const std::vector<NodeLink*>& fresh);
  void finish_with(const FinishMsg& f);
  Admission::RoundView round_view() const;
  std::string nnodes_text() const;
  void broadcast(const std::string& type, const Body& body);
  void info(const std::string& line) const;

  NodeGroupOptions opts_;
  bool coordinator_ = true;
  AssignMsg assign_;
  std::optional<PortReservation> master_port_;  // node 0: this round's workers' store port, held
  // node 0: the previous rounds' ports, held (never listening), at most kHeldEarlierPorts of them
  static constexpr size_t kHeldEarlierPorts = 1;
  std::deque<PortReservation> earlier_ports_;
  std::unique_ptr<Links> links_;            // the other nodes (fd(): their epoll set)
  Admission admission_;                     // elastic coordinator: nodes that join later
  RoundState state_ = RoundState::Running;  // changed by enter() only
  int round_ = 0;
  int restarts_used_ = 0;
  std::vector<std::string> failed_attempts_;  // failed_attempts()
  bool local_done_ = false;                   // this node's workers of the round (round_) have all exited
  LocalRound local_;                          // the launcher's round: reset by take_start()
  Restart restart_;                           // Restarting: the round take_start() begins
  std::optional<int> start_;                  // a round begun, for take_start() (once)
  std::optional<FinishMsg> finish_;           // Finished: the job's end
  std::vector<Cause> causes_;                 // coordinator: this round's failures
  std::optional<Cause> lost_coordinator_;     // member
};

}  // namespace lspawn::node
