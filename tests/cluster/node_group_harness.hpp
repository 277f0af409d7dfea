// Node groups in one test process (tests only): K lspawn node groups (cluster/node_group.hpp) on
// 127.0.0.1, each formed and driven on its own thread the way launcher/run.cpp drives its group,
// with the workers replaced by events the test injects. The cases: tests/cluster/node_group_
// {rendezvous,round,elastic}_test.cpp; what they check in common: node_group_checks.hpp.
//
// A HarnessNode is one lspawn: its thread calls form() (which blocks until the nodes met), then
// loops as run.cpp's drive_round() does:
//   report the local events   a failure → local_failure() once per round; stop_requested() while
//                             the fake workers run → they stop (at once); the workers all exited
//                             → local_done(failed, cause) once per round
//   take_start()              a next round: the workers run again (fresh per-round flags)
//   finish()                  the job is over: flush_for(1 s), the group is destroyed, the
//                             thread ends (as lspawn exits)
//   wait for the channel      the workers run: fd() watched until next_wakeup(), then on_readable();
//                             they have exited: wait(max, the harness's wake-up fd), as run.cpp
//                             waits on its signal fd
//   tick()
// The fake workers of a round run until the test says they failed (fail(), hang()) or all
// exited (succeed()), or until the group asks them to stop. What the group did is copied after
// every step into a NodeView, read by the test thread (view(), await()): only the node's thread
// touches its group (the group is not thread-safe).
//
// Faults: die() destroys the group on its thread at once (its sockets close: the peers see what
// they would see if this lspawn was SIGKILLed); go_silent() stops driving it (no reads, no
// heartbeats, sockets open: a stopped or wedged lspawn).
//
// The group type is named once, here (TestedGroup), so a rename is one line.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster/node_group.hpp"
#include "supervisor/port.hpp"
#include "sys/sys.hpp"

namespace lspawn::test {

using TestedGroup = node::NodeGroup;
using TestedGroupOptions = node::NodeGroupOptions;
using TestedRendezvousError = node::NodeRendezvousError;

// What a node's group did, as its thread last saw it.
struct NodeView {
  bool formed = false;           // form() returned
  std::string rendezvous_error;  // form() threw RendezvousError: its what()
  std::string other_error;       // anything else thrown on the node's thread: its what()
  bool coordinator = false;
  node::AssignMsg assignment;  // this round's (an elastic job's changes between rounds)
  int round = -1;
  int restarts_used = 0;
  std::vector<std::string> failed_attempts;
  std::vector<int> rounds_started;  // what take_start() gave, in order
  std::vector<int> rounds_stopped;  // rounds in which stop_requested() was seen
  std::vector<int> rounds_done;     // rounds whose local_done() was sent
  std::optional<node::FinishMsg> finish;
  std::vector<std::pair<int, std::string>> hang_messages;  // on_hang_message: (from, type)
  std::vector<std::string> info;                           // GroupOptions::info lines
  bool ended = false;                                      // the thread is over (finished, died, or failed to form)

  bool stopped_in(int r) const;
  bool has_info(const std::string& part) const;  // some info line contains `part`
};

class HarnessNode {
 public:
  // Starts the node's thread: form(opts), then the drive loop. opts.on_hang_message is the
  // harness's (recorded in the view); each info line is recorded in the view, after opts.info
  // (when set) was called with it on the node's thread.
  explicit HarnessNode(TestedGroupOptions opts);
  // Stops driving and joins the thread (the group is destroyed). A node still in form() is
  // waited for: form() returns by its rdzv_timeout at the latest.
  ~HarnessNode();
  HarnessNode(const HarnessNode&) = delete;
  HarnessNode& operator=(const HarnessNode&) = delete;

  const std::string& host() const { return host_; }
  NodeView view() const;
  // Waits until pred(view) holds or `limit` passes; returns pred of the last view (so the test
  // asserts on it: REQUIRE(node.await(...))).
  bool await(const std::function<bool(const NodeView&)>& pred, std::chrono::milliseconds limit) const;

  // The fake workers of the current round (events the supervisor would report):
  // a worker failed (local rank `local_rank`, `exit_code`, at wall-clock `time_us`; 0: now), and
  // then every worker of this node exited (the supervisor stops the others).
  void fail(int local_rank, int exit_code, int64_t time_us = 0);
  // The hang watchdog stopped this node's workers (a Cause of kind "hang", exit code kHang, as
  // run.cpp's fill_hang_cause), and they exited.
  void hang();
  // Every worker of this node exited 0.
  void succeed();
  // From now on this node's fake workers do not stop when the group asks (a worker taking its
  // grace period): they run until fail(), hang() or succeed().
  void hold_workers_on_stop();
  // A hang-diagnosis message to node `to` (send_hang_message): "status", "stacks?" or "stacks",
  // with an empty body of its kind for the current round.
  void send_hang_message(int to, const std::string& type);

  // This lspawn dies: the group is destroyed now (its sockets close), the thread ends.
  void die();
  // This lspawn stops driving its group (no reads, no heartbeats; its sockets stay open) until
  // it is destroyed.
  void go_silent();

 private:
  struct Round;  // the fake workers' state of one round (node_group_harness.cpp)
  using Command = std::function<void(TestedGroup&, Round&)>;
  void post(Command cmd);
  void main();
  void drive(TestedGroup& g);
  void publish(const TestedGroup* g, const std::function<void(NodeView&)>& also = {});

  TestedGroupOptions opts_;
  std::string host_;
  sys::Pipe wake_;  // the test thread → the node's thread: a command is queued

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  NodeView view_;                 // under mu_
  std::deque<Command> commands_;  // under mu_
  bool quit_ = false;             // under mu_
  bool silent_ = false;           // under mu_
  bool die_ = false;              // under mu_

  std::thread thread_;
};

// One job's nodes on 127.0.0.1: the rendezvous endpoint is a port reserved as lspawn reserves
// MASTER_PORT (supervisor/port.hpp: bound with SO_REUSEADDR, not listening), held for the
// object's life, so the coordinator's listen on it succeeds and nobody else's bind(0) gets it.
class LoopbackJob {
 public:
  LoopbackJob();
  int port() const { return port_.port(); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port()); }

  // Options of node `node_rank` (static mode: --master-addr 127.0.0.1 --master-port port(); node
  // 0 hosts) of a job of `nnodes`, host "node<node_rank>": node timeout 3 s, rendezvous timeout
  // 10 s (no case waits for either unless it sets them shorter).
  TestedGroupOptions static_options(int nnodes, int node_rank) const;
  // Options of one lspawn of a --rdzv-endpoint job (whoever binds hosts; node ranks assigned) of
  // --nnodes MIN:MAX (min_nnodes 0: a fixed count), host `host`.
  TestedGroupOptions rdzv_options(int nnodes, int min_nnodes, const std::string& host) const;

  // Starts a node (its thread forms the group).
  HarnessNode& add(TestedGroupOptions opts);
  std::vector<std::unique_ptr<HarnessNode>>& nodes() { return nodes_; }
  HarnessNode& operator[](size_t i) { return *nodes_[i]; }
  // Waits until pred holds for every node's view (or `limit` passes, over all nodes together).
  bool await_all(const std::function<bool(const NodeView&)>& pred, std::chrono::milliseconds limit) const;

 private:
  PortReservation port_;
  std::vector<std::unique_ptr<HarnessNode>> nodes_;
};

}  // namespace lspawn::test
