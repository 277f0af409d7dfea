// The node group's connections to the other nodes (node_group.hpp): one Link per node, all in one
// epoll set, and their upkeep: heartbeats, node timeouts, writes the socket did not take whole.
// A coordinator holds one per member; a member holds one, to the coordinator. Links decides no
// fate: a link that breaks or falls silent is handed to the caller's `lost` (the round driver's
// NodeGroup::lost()), which drops it here.
//
// Upkeep is a sweep over every node, done by sweep() when sweep_due(): kSweepsPerHeartbeat sweeps
// per heartbeat interval, and one kFlushRetry after a write the socket did not take whole. Between
// sweeps the checks cost nothing, so a coordinator woken by thousands of nodes' messages does not
// walk every node on each wake-up. A node's silence is therefore noticed up to a quarter of the
// heartbeat interval after --node-timeout (at most 250 ms).
// Thread-safety: none; the node group's thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/node_channel.hpp"
#include "sys/epoll.hpp"

struct pollfd;

namespace lspawn::node {

using Clock = sys::Clock;

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

// poll() on `pfds` until one is ready or `deadline` (EINTR: 0 ready). Returns how many are ready.
// Throws SysError.
int poll_fds(std::vector<struct pollfd>& pfds, Clock::time_point deadline);

// One other node of the job, as this node knows it.
struct NodeLink {
  int node_rank = -1;
  std::string host;
  std::string addr;
  std::unique_ptr<Link> link;      // null once lost
  bool done = false;               // the round driver's: its workers of this round have exited
  Clock::time_point busy_until{};  // its announced silence (BusyMsg) ends then
};

class Links {
 public:
  // Called for a link that broke (a send or read threw LinkError) or fell silent; `why` says how.
  // It is expected to drop() it.
  using Lost = std::function<void(NodeLink&, const std::string& why)>;

  static constexpr int kSweepsPerHeartbeat = 4;
  static constexpr std::chrono::milliseconds kFlushRetry{10};

  Links() = default;
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  // The epoll set: every node's link, and (admission.hpp) an elastic job's endpoint and joiners.
  sys::Epoll& poller() { return poller_; }
  int fd() const { return poller_.fd(); }

  // The nodes, in the order kept (coordinator: by node rank after each elastic round).
  std::vector<std::unique_ptr<NodeLink>>& nodes() { return nodes_; }
  const std::vector<std::unique_ptr<NodeLink>>& nodes() const { return nodes_; }
  // Takes `n` (its link open): watched from now on (add_to_poller: false when it is in the
  // poller already, since its accept). Returns it.
  NodeLink& add(std::unique_ptr<NodeLink> n, bool add_to_poller);
  // The node whose link has fd `fd`; null when none.
  NodeLink* by_fd(int fd);
  // Its link out of the poller and closed (the node stays, lost).
  void drop(NodeLink& n);
  // Forgets the nodes whose link was dropped.
  void erase_lost();
  // This node and the others whose link is open.
  int alive() const;

  // Sends to `n` (its link open); a broken link goes to `lost`.
  void send(NodeLink& n, const std::string& type, const Body& body, const Lost& lost);
  // Sends to every node whose link is open.
  void broadcast(const std::string& type, const Body& body, const Lost& lost);
  // Sends to node `node_rank` when its link is open; else nothing.
  void send_to(int node_rank, const std::string& type, const Body& body, const Lost& lost);
  // After messages sent outside send() (a large assignment each): the next sweep comes soon,
  // to write what the sockets did not take.
  void flush_soon() { flush_soon_ = true; }

  // Whether a sweep is due at `now`.
  bool sweep_due(Clock::time_point now) const { return now >= next_sweep_ || (flush_soon_ && now >= flush_at_); }
  // The sweep: a node silent for `node_timeout` (past its announced busy time) is lost; to each
  // other one a heartbeat when nothing went out for `heartbeat`, else what is still queued; and,
  // once a heartbeat interval, each link's retransmission ceiling fitted to its round trip
  // (sys::tcp_fit_retransmission_ceiling).
  void sweep(Clock::time_point now, std::chrono::milliseconds heartbeat, std::chrono::milliseconds node_timeout,
             const std::string& timeout_why, const Lost& lost);
  // When the next sweep is due.
  Clock::time_point next_sweep() const { return flush_soon_ ? std::min(next_sweep_, flush_at_) : next_sweep_; }
  // Before exiting: gives the messages still queued up to `limit` to leave and to be acknowledged
  // by the peers' kernels (a link that breaks is dropped, no one told), reading and dropping what
  // comes in meanwhile. Then the exit's close is no reset that overtakes the last message: on a
  // link of seconds a `finish` still in flight was lost that way (docs/reliability.md, "Slow and
  // lossy links"). On a LAN the acknowledgements take microseconds.
  void flush_for(std::chrono::milliseconds limit);

 private:
  sys::Epoll poller_{"control channel"};
  std::vector<std::unique_ptr<NodeLink>> nodes_;
  std::unordered_map<int, NodeLink*> by_fd_;  // the nodes with a link, by its fd
  Clock::time_point next_sweep_{};
  Clock::time_point next_fit_{};  // sys::tcp_fit_retransmission_ceiling of every link, once a heartbeat
  bool flush_soon_ = false;       // a link holds bytes its socket did not take
  Clock::time_point flush_at_{};
};

}  // namespace lspawn::node
