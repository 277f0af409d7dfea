// The lspawn processes of one job, one per node, as one group: rendezvous, then one fate per
// round (docs/multi-node.md).
//
// Rendezvous (form()): the coordinator listens on the rendezvous endpoint (static mode:
// --master-addr:--master-port, and node 0 is the coordinator; --rdzv-endpoint mode: whichever
// lspawn can bind the endpoint), every other lspawn connects and sends JoinMsg, which the
// coordinator answers at once (JoinedMsg). When --nnodes have joined, the coordinator assigns
// node ranks (the ones given; the others in join order, coordinator first), the run id
// (--run-id/--rdzv-id, else a random one drawn by the coordinator: every node gets the same),
// and the workers' MASTER_ADDR/MASTER_PORT (node 0's address, a port node 0 reserved), and
// sends AssignMsg: round 0 starts (membership.hpp: when it forms, the node ranks).
// A node that can neither host nor join (--rdzv-endpoint mode: bind fails and nothing that
// answers a join listens there; static mode: node 0 cannot be reached) tries again (hosting
// too, in --rdzv-endpoint mode) and says what it tried and what answered 3 s after it began and
// then every 5 s ("bind: Address already in use", "connect: Connection refused", "HOST:PORT
// accepted the connection but sent nothing lspawn understands in 3 s"); the rendezvous
// timeout's error names that cause. A connection that was accepted but is silent is kept (a
// coordinator that answers late is still joined), one that closes or sends bytes that are no
// frame of the channel's is dropped and the node tries again.
//
// Round protocol (one RoundState, round.hpp: the state x event table; the coordinator's, and
// each member's copy, moved by the coordinator's messages):
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
// (heartbeats every min(1 s, timeout / 4); TCP_USER_TIMEOUT and keepalive at the same timeout).
//
// Elastic jobs (--nnodes MIN:MAX, rendezvous mode; docs/multi-node.md "Elastic jobs"): the
// rendezvous forms with MAX nodes, or with at least MIN once last_call has passed since MIN
// joined (or at the rendezvous timeout); the coordinator is node 0 and keeps listening. Each
// round may change the nodes: a lost node ends the round and, with restarts left and at least
// MIN nodes remaining, the next round runs on the survivors (a restart, as under torchrun); a
// node that joins while every node runs stops the round and the next round admits it (not a
// restart). Before such a round every node gets a new AssignMsg (node ranks 0..n-1: the
// coordinator, then the others in their old order, then the new ones in join order).
//
// nnodes == 1: no channel at all; the same round protocol runs locally (restarts of a
// single-node job).
// Thread-safety: none; one thread drives it (the CLI's loop).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <string>
#include <vector>

#include "cluster/node_channel.hpp"
#include "cluster/round.hpp"
#include "sys/epoll.hpp"
#include "supervisor/port.hpp"

namespace lspawn::node {

using Clock = sys::Clock;

struct GroupOptions {
  std::string endpoint_addr = "127.0.0.1";  // static: --master-addr; else the rdzv host
  int endpoint_port = 0;                    // static: --master-port; else the rdzv port
  bool static_mode = true;                  // node 0 hosts; false: whoever binds the endpoint
  int nnodes = 1;                           // --nnodes N, or MAX of MIN:MAX
  int min_nnodes = 0;                       // MIN of --nnodes MIN:MAX (rdzv mode); 0: fixed
  std::chrono::milliseconds last_call{30000};  // elastic: wait for more once MIN have joined
  int node_rank = -1;                       // -1: assigned (rdzv mode only)
  int nproc_per_node = 1;
  int max_restarts = 0;
  std::vector<int> no_restart_exit_codes;   // the coordinator's decide (round.hpp)
  std::string run_id;                       // empty: the coordinator draws one
  std::chrono::milliseconds node_timeout{30000};
  std::chrono::milliseconds rdzv_timeout{600000};
  std::string host;                         // this node's name, for reports
  // Rendezvous mode (--rdzv-endpoint) only: the address this node advertises for its workers'
  // store should it become node 0 (--local-addr; reserved there, so it must be one of this
  // host's). Empty: the rendezvous host on the node hosting the rendezvous, else the local
  // address of this node's connection to it.
  std::string local_addr;
  std::function<void(const std::string&)> info;  // informational lines; may be null
  // Hang diagnosis across nodes: the messages "status", "stacks?" and "stacks" (node_channel.hpp)
  // that came from node `from` (its node rank). May be null (they are then dropped).
  std::function<void(int from, const Message&)> on_hang_message;
};

// The rendezvous failed: not every node came within the timeout, the nodes disagree on the
// job (nproc, nnodes, run id), node ranks clash, or the coordinator could not be reached.
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How often a node of a job of `nnodes` nodes sends a heartbeat when nothing else went out:
// min(max(1 s, 1 ms per node), node_timeout / 4), at least 20 ms. Up to 1,000 nodes that is every
// second (node_timeout / 4 if shorter); beyond, the coordinator, which sends one to every node and
// hears one from every node, keeps to about 1,000 a second each way (bench/scale: a heartbeat
// costs it ~40 µs of CPU on loopback, where it also pays the receiver's side; docs/scale.md).
std::chrono::milliseconds heartbeat_interval(int nnodes, std::chrono::milliseconds node_timeout);
// How often a member sends its ranks' status records to the coordinator while they change:
// every max(250 ms, 1 ms per node) at most, for the same budget; unchanged, once per
// max(1 s, heartbeat interval).
std::chrono::milliseconds status_interval(int nnodes);

class Group {
 public:
  // Blocks until the job's nodes have met (throws RendezvousError, or PortError when the
  // static coordinator cannot listen on --master-port). nnodes == 1: returns at once.
  // solo_master_port: nnodes == 1 only, the workers' MASTER_PORT (0: a free one).
  static std::unique_ptr<Group> form(const GroupOptions& opts, int solo_master_port = 0);
  ~Group();

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
  // heartbeat_interval() and status_interval() above, for this round's node count.
  std::chrono::milliseconds heartbeat_interval() const;
  std::chrono::milliseconds status_interval() const;

  // The one fd to watch for the channel (POLLIN), the same for the whole job: an epoll set,
  // readable while any node's link (or an elastic job's endpoint) has input, so a wake-up costs
  // the same with 4 nodes or 4,096.
  int fd() const { return poller_.fd(); }
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
  // stops everywhere), then the round's end (every local worker exited; failed: the settled
  // local root cause).
  void local_failure(const Cause& cause);
  void local_done(bool failed, const Cause& cause);

  // This round's workers must stop (a failure or a lost node elsewhere).
  bool stop_requested() const { return state_ != RoundState::Running; }
  // A new round was decided: the round to start now (once). On the coordinator this is where
  // the round begins (an elastic job's nodes are renumbered, the others told): call it outside
  // of the group's own callbacks.
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
  struct Node;
  struct Joiner;
  struct Gathering;  // the coordinator's rendezvous (node_group.cpp)
  struct Joining;    // a member's connection to the coordinator, answered (node_group.cpp)
  struct Restart {   // decided by maybe_decide(), begun by take_start()
    Cause cause;
    bool counted = true;  // a restart of --max-restarts (false: a node is admitted)
  };
  static constexpr int kSweepsPerHeartbeat = 4;
  static constexpr std::chrono::milliseconds kFlushRetry{10};
  static constexpr int kReadyPerCall = 512;
  Group() = default;
  static std::unique_ptr<Group> form_solo(const GroupOptions& o, int master_port);
  static std::unique_ptr<Group> form_coordinator(const GroupOptions& o, sys::Fd listener, Clock::time_point t0);
  static std::unique_ptr<Group> form_member(const GroupOptions& o, Joining joining, Clock::time_point t0);
  // The round state's one way to change (round.hpp's table); false: the event is not acted on.
  bool enter(RoundEvent e);
  void watch(Node& n);      // its link into poller_ and by_fd_
  void drop_link(Node& n);  // out of both, and closed
  void drop_joiner(size_t i);
  void read_node(Node& n);
  void handle(Node& n, const Message& m);
  void handle_member_message(const Message& m);
  void on_stop(const StopMsg& s);
  void on_start(const StartMsg& st);
  void lost(Node& n, const std::string& why);
  void coordinator_failure(const Cause& c);
  void node_done(int node_rank, bool failed, const Cause& c);
  void maybe_decide();
  void say_restart(const RoundDecision& d) const;
  void begin_round();
  std::vector<Node*> renumber_elastic();
  void send_round(const Cause& cause, const std::vector<Node*>& fresh);
  void finish_with(const FinishMsg& f);
  void accept_joiners();
  void on_joiner_readable(size_t i);
  std::string admit_or_refuse(Joiner& jn, const JoinMsg& j);
  int nodes_alive() const;
  int waiting_joiners() const;  // accepted, waiting for the next round
  std::string nnodes_text() const;
  void broadcast(const std::string& type, const Body& body);
  void info(const std::string& line) const;


  GroupOptions opts_;
  bool coordinator_ = true;
  AssignMsg assign_;
  std::optional<PortReservation> master_port_;  // node 0: the workers' store port, held
  sys::Epoll poller_{"control channel"};       // every link and the elastic endpoint (fd())
  std::vector<std::unique_ptr<Node>> nodes_;    // coordinator: one per member; member: the coordinator
  std::unordered_map<int, Node*> by_fd_;        // the nodes with a link, by its fd
  sys::Fd listener_;                            // elastic coordinator: the rendezvous endpoint
  std::string endpoint_;                        // "HOST:PORT" of the rendezvous
  std::vector<std::unique_ptr<Joiner>> joiners_;  // elastic coordinator: nodes waiting to join
  bool unjoined_full_said_ = false;             // too many connections without a join (said once)
  RoundState state_ = RoundState::Running;      // changed by enter() only
  int round_ = 0;
  int restarts_used_ = 0;
  std::vector<std::string> failed_attempts_;  // failed_attempts()
  bool local_done_ = false;      // this node's workers of the round have all exited
  Restart restart_;              // Restarting: the round take_start() begins
  std::optional<int> start_;     // a round begun, for take_start() (once)
  std::optional<FinishMsg> finish_;  // Finished: the job's end
  std::vector<Cause> causes_;    // coordinator: this round's failures
  std::optional<Cause> lost_coordinator_;  // member
  Clock::time_point next_sweep_{};         // tick()'s next sweep over every node
  bool flush_soon_ = false;                // a link holds bytes its socket did not take
  Clock::time_point flush_at_{};
};

}  // namespace lspawn::node
