// Elastic admission (docs/multi-node.md "Elastic jobs"): after an elastic job (--nnodes MIN:MAX,
// MIN < MAX) formed, its coordinator keeps the rendezvous endpoint open. A node that connects and
// joins is checked as at the rendezvous (endpoint.hpp's join_mismatch; not after the job ended;
// not beyond MAX) and answered at once (JoinedMsg: it waits), or turned away (RejectMsg, said
// here too). A waiting node is admitted by the next round: the round driver (node_group.hpp)
// begins it with admit_waiting(), which numbers every node again (membership.hpp's
// elastic_node_ranks). A node that
// joins while every node's workers run stops the round (on_ready() returns it; the round driver
// makes it the round's failure); otherwise it waits for a next round, should there be one.
//
// Connections without a join message: at most kMaxUnjoined at a time (more are closed as they
// come, said once), each for at most --node-timeout (drop_overdue()).
// A fixed job's coordinator has no Admission open: its endpoint closed when the job formed.
// Thread-safety: none; the node group's thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/endpoint.hpp"
#include "cluster/links.hpp"

namespace lspawn::node {

class Admission {
 public:
  // What the round driver tells about the round when a join comes.
  struct RoundView {
    bool ended = false;               // the job is over
    int nodes_alive = 0;              // this node and the others whose link is open
    bool every_node_running = false;  // Running, and no node's workers of the round have exited
  };
  // A node that joined while every node's workers ran: the round stops, the next one admits it.
  struct Admitted {
    std::string peer;  // "mn-c (10.0.0.3)"
    std::string host;
  };

  Admission(const NodeGroupOptions& o, Links& links) : o_(o), links_(links) {}

  // The job formed (elastic): the endpoint `endpoint` ("HOST:PORT") stays open on `listener`
  // (watched already when `listener_watched`), and `unjoined`, the connections that had sent no
  // join yet, stay in the poller as joiners.
  void open(sys::Fd listener, bool listener_watched, std::string endpoint, std::vector<Joiner> unjoined);
  bool is_open() const { return static_cast<bool>(listener_); }
  const std::string& endpoint() const { return endpoint_; }

  // `fd` is ready: the endpoint (accepts) or a joiner's connection (reads its join); another fd
  // is none of admission's (nothing). `view` is asked when a join comes. Returns the node that
  // joined while every node's workers ran, if one did.
  std::optional<Admitted> on_ready(int fd, const std::function<RoundView()>& view);
  // Joiners without a join message past --node-timeout: closed, said.
  void drop_overdue(Clock::time_point now);
  // Any connection at all (the node group's next_wakeup()).
  bool any() const { return !joiners_.empty(); }
  // Joined and waiting for the next round.
  int waiting() const;
  // The coordinator begins an elastic round: the lost nodes go, the waiting ones come in, and
  // every node gets its place (membership.hpp's elastic_node_ranks; the links sorted by node
  // rank), written into `assign` (node count, hosts; this node is node 0 and the coordinator).
  // Returns the admitted nodes (their AssignMsg starts them, no StartMsg).
  std::vector<NodeLink*> admit_waiting(AssignMsg& assign);
  // The job ended (exit code `exit_code`): every waiting one is told so.
  void job_ended(int exit_code);

 private:
  void accept();
  void on_joiner_readable(size_t i, const std::function<RoundView()>& view, std::optional<Admitted>* admitted);
  std::string admit_or_refuse(Joiner& jn, const JoinMsg& j, const std::function<RoundView()>& view,
                              std::optional<Admitted>* admitted);
  void drop(size_t i);
  void info(const std::string& line) const {
    if (o_.info) o_.info(line);
  }

  const NodeGroupOptions& o_;
  Links& links_;
  sys::Fd listener_;                              // the rendezvous endpoint
  std::string endpoint_;                          // "HOST:PORT" of the rendezvous
  std::vector<std::unique_ptr<Joiner>> joiners_;  // nodes waiting to join, or not joined yet
  bool unjoined_full_said_ = false;               // too many connections without a join (said once)
};

}  // namespace lspawn::node
