#include "cluster/rendezvous.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <thread>
#include <unordered_map>

#include <poll.h>

#include "cluster/membership.hpp"
#include "cluster/rendezvous_state.hpp"
#include "supervisor/job_secret.hpp"
#include "sys/duration_text.hpp"

namespace lspawn::node {

namespace {

using std::chrono::milliseconds;

// "3 s": a duration rounded to whole seconds, for what is said while the rendezvous goes on
// (a countdown: sys/duration_text.hpp's elapsed_text would say "2.9 s").
std::string whole_seconds(Clock::duration d) {
  return seconds_text(std::chrono::seconds(std::llround(std::max(std::chrono::duration<double>(d).count(), 0.0))));
}

void say(const NodeGroupOptions& o, const std::string& line) {
  if (o.info) o.info(line);
}

// Reads one message from a link during the rendezvous, before `deadline`.
std::optional<Message> read_one(Link& link, std::vector<Message>& queue, Clock::time_point deadline) {
  while (queue.empty()) {
    std::vector<pollfd> p{{link.fd(), POLLIN, 0}};
    if (poll_fds(p, deadline) == 0 && Clock::now() >= deadline) return std::nullopt;
    for (auto& m : link.read()) queue.push_back(std::move(m));
  }
  Message m = std::move(queue.front());
  queue.erase(queue.begin());
  return m;
}

// ---- A node that is not the coordinator (yet) ------------------------------------------------

// What it tried and what answered, said 3 s after the rendezvous began and then every 5 s while
// it tries again, and named by the timeout's error.
struct Attempts {
  static constexpr milliseconds kFirstReport{3000};
  static constexpr milliseconds kReportEvery{5000};
  static constexpr milliseconds kAnswerWait{3000};  // a coordinator answers a join at once
  // A connect that times out is tried again with twice the wait, up to kMaxConnectWait: a link
  // whose round trip is longer than a try (2 s one way: its SYN-ACK comes after 4 s) is then
  // joined on a later try instead of never (docs/reliability.md, "Slow and lossy links").
  static constexpr milliseconds kFirstConnectWait{2000};
  static constexpr milliseconds kMaxConnectWait{32000};

  const NodeGroupOptions& o;
  const std::string ep;
  const Clock::time_point t0;
  const Clock::time_point deadline;
  std::string host_problem;  // --rdzv-endpoint mode: why this node cannot host ("bind: ...")
  std::string join_problem;  // why it could not join ("connect: ...", "EP accepted ...")
  Clock::time_point next_report;
  milliseconds connect_wait = kFirstConnectWait;  // the next try's connect: doubled by each timeout

  explicit Attempts(const NodeGroupOptions& opts)
      : o(opts),
        ep(endpoint_of(opts)),
        t0(Clock::now()),
        deadline(t0 + opts.rdzv_timeout),
        next_report(t0 + kFirstReport) {}

  // How long the next connect may take: `connect_wait`, never past the deadline.
  milliseconds next_connect_wait() const {
    return std::max(milliseconds(0),
                    std::min(connect_wait, std::chrono::duration_cast<milliseconds>(deadline - Clock::now())));
  }
  void connect_timed_out() { connect_wait = std::min(connect_wait * 2, kMaxConnectWait); }

  void cannot_host(int err) {
    // Not an address of this host: another host's lspawn hosts it (nothing to say).
    host_problem = err == EADDRNOTAVAIL ? "" : std::string("bind: ") + std::strerror(err);
  }
  // "could not host it (bind: ...) nor join it: connect: Connection refused"
  std::string what_failed() const {
    if (!o.static_mode && !host_problem.empty()) {
      return "this node could not host it (" + host_problem + ") nor join it: " + join_problem;
    }
    return (o.static_mode ? "node 0 could not be reached: " : "this node could not join it: ") + join_problem;
  }
  void report_if_due() {
    const auto now = Clock::now();
    if (join_problem.empty() || now < next_report) return;
    next_report = now + kReportEvery;
    say(o, "rendezvous on " + ep + ": " + what_failed() + "; still trying (" + whole_seconds(deadline - now) +
               " of --rdzv-timeout " + seconds_text(o.rdzv_timeout) + " left)");
  }
  [[noreturn]] void timed_out() const {
    throw NodeRendezvousError("rendezvous on " + ep + " timed out after " + seconds_text(o.rdzv_timeout) + ": " +
                              what_failed());
  }
};

// A member's connection to the coordinator once it has answered the join ("joined", or the
// assignment at once).
struct Joining {
  // One try: connect, send the join, wait for the answer. False: nothing that answers a join
  // is there (tries.join_problem says what was). Throws NodeRendezvousError (a reject, the timeout).
  bool try_join(const NodeGroupOptions& o, Attempts& tries);

  std::unique_ptr<Link> link;
  std::vector<Message> queue;               // read after the answer
  std::optional<PortReservation> own_port;  // --rdzv-endpoint mode: the workers' port, should it be node 0
  int joined = 0;                           // nodes that had joined when it answered (JoinedMsg); 0: not said
};

JoinMsg join_of(const NodeGroupOptions& o) {
  JoinMsg j;
  j.host = o.host;
  j.node_rank = o.node_rank;
  j.nnodes = o.nnodes;
  j.min_nnodes = o.min_nnodes;
  j.nproc_per_node = o.nproc_per_node;
  j.max_restarts = o.max_restarts;
  j.run_id = o.run_id;
  return j;
}

// Waits on a member's fresh link for the coordinator's answer to its join: true once it came
// ("joined" or "assign"; what came is in `queue`). False when the peer closed the connection or
// sent bytes that are no frame of the channel's (`tries.join_problem` says which): not the
// coordinator. A silent peer is waited for, said after Attempts::kAnswerWait, until the deadline.
bool await_answer(Link& link, std::vector<Message>& queue, int* joined, Attempts& tries) {
  const auto sent = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    const auto answer_due = sent + Attempts::kAnswerWait;
    tries.join_problem = tries.ep + " accepted the connection but sent nothing lspawn understands in " +
                         whole_seconds(now - sent) + " (an lspawn coordinator answers a join at once)";
    if (now >= tries.deadline) tries.timed_out();
    if (now >= answer_due) tries.report_if_due();  // moves next_report past now when due
    std::vector<pollfd> p{{link.fd(), POLLIN, 0}};
    poll_fds(p, std::min(tries.deadline, now < answer_due ? answer_due : tries.next_report));
    if (!p[0].revents) continue;
    try {
      for (auto& m : link.read()) queue.push_back(std::move(m));
    } catch (const LinkError& e) {
      tries.join_problem =
          not_our_frames(e) ? tries.ep + " answered with bytes that are no lspawn message (" + e.what() + ")"
                            : tries.ep + " accepted the connection and closed it without answering (" + e.what() + ")";
      return false;
    }
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->type == "reject") throw NodeRendezvousError(it->as<RejectMsg>().reason);
      if (it->type == "assign") return true;
      if (it->type == "joined") {
        *joined = it->as<JoinedMsg>().joined;
        queue.erase(it);
        return true;
      }
    }
  }
}

bool Joining::try_join(const NodeGroupOptions& o, Attempts& tries) {
  const milliseconds wait = tries.next_connect_wait();
  int err = 0;
  sys::Fd fd;
  try {
    fd = sys::tcp_connect(o.endpoint_addr, o.endpoint_port, wait, &err);
  } catch (const sys::SysError& e) {
    throw NodeRendezvousError("rendezvous on " + tries.ep + ": " + e.what());
  }
  if (!fd) {
    tries.join_problem = std::string("connect: ") + std::strerror(err);
    if (err == ETIMEDOUT) {
      tries.join_problem += " (no answer in " + seconds_text(wait) + ")";
      tries.connect_timed_out();
    }
    return false;
  }
  sys::tcp_set_liveness(fd.get(), o.node_timeout, "rendezvous on " + tries.ep);
  JoinMsg j = join_of(o);
  own_port.reset();
  if (!o.static_mode && o.node_rank <= 0) {
    j.worker_addr = o.local_addr.empty() ? sys::local_ip(fd.get()) : o.local_addr;
    own_port.emplace(j.worker_addr, 0);
    j.worker_port = own_port->port();
  }
  link = std::make_unique<Link>(std::move(fd), "the coordinator at " + tries.ep);
  queue.clear();
  try {
    link->send("join", j);
    if (await_answer(*link, queue, &joined, tries)) return true;
  } catch (const LinkError& e) {
    tries.join_problem = tries.ep + " accepted the connection and closed it without answering (" + e.what() + ")";
  } catch (const BadMessage& e) {
    throw NodeRendezvousError("rendezvous on " + tries.ep + ": bad message from the coordinator: " + e.what());
  }
  link.reset();
  return false;
}

// A member whose join was answered: waits for its assignment (until the rendezvous deadline).
FormedJob form_member(const NodeGroupOptions& o, Joining joining, Clock::time_point t0) {
  FormedJob job;
  job.coordinator = false;
  job.links = std::make_unique<Links>();
  const auto deadline = t0 + o.rdzv_timeout;
  const std::string ep = endpoint_of(o);
  auto node = std::make_unique<NodeLink>();
  node->addr = sys::peer_ip(joining.link->fd());
  node->link = std::move(joining.link);
  std::vector<Message>& queue = joining.queue;
  try {
    for (;;) {
      auto m = read_one(*node->link, queue, deadline);
      if (!m) {
        throw NodeRendezvousError(
            "rendezvous on " + ep + " timed out after " + seconds_text(o.rdzv_timeout) +
            " waiting for the other nodes" +
            (joining.joined > 0 ? " (" + std::to_string(joining.joined) + " had joined when this node did)" : ""));
      }
      if (m->type == "reject") throw NodeRendezvousError(m->as<RejectMsg>().reason);
      if (m->type != "assign") continue;
      job.assign = m->as<AssignMsg>();
      break;
    }
  } catch (const LinkError& e) {
    throw NodeRendezvousError("rendezvous on " + ep + ": lost the connection to the coordinator (" + e.what() + ")");
  } catch (const BadMessage& e) {
    throw NodeRendezvousError("rendezvous on " + ep + ": bad message from the coordinator: " + e.what());
  }
  const AssignMsg& a = job.assign;
  if (a.node_rank == 0 && joining.own_port) job.master_port.emplace(std::move(*joining.own_port));
  const int coord_rank = a.coordinator;
  if (coord_rank < 0 || coord_rank >= a.nnodes || a.hosts.size() != static_cast<size_t>(a.nnodes) || a.node_rank < 0 ||
      a.node_rank >= a.nnodes) {
    throw NodeRendezvousError("rendezvous on " + ep + ": inconsistent assignment from the coordinator");
  }
  node->node_rank = coord_rank;
  node->host = a.hosts[static_cast<size_t>(coord_rank)];
  node->link->set_peer("the coordinator (" + node->host + ", " + ep + ")");
  node->link->touch();
  job.links->add(std::move(node), true);
  job.queued = std::move(queue);
  job.formed_line = "rendezvous: node " + std::to_string(a.node_rank) + " of " + std::to_string(a.nnodes) + " after " +
                    elapsed_text(Clock::now() - t0);
  return job;
}

// ---- The coordinator -------------------------------------------------------------------------

// The coordinator's rendezvous, one step per function over this state: the connections that came
// (pending) until the job forms (formation: rendezvous_state.hpp), then their node ranks and
// assignments, into `job`.
struct Gathering {
  using PendingList = std::list<Joiner>;  // in accept order; an element stays where it is

  const NodeGroupOptions& o;
  const std::string ep;
  const Clock::time_point t0;
  const Clock::time_point deadline;
  const bool elastic;
  FormedJob& job;
  sys::Fd listener;
  Formation formation;
  PendingList pending;
  std::unordered_map<int, PendingList::iterator> by_fd;  // the pending connections by fd
  // Accepted, no join yet: at most kMaxUnjoined. The listener is in the poller exactly while
  // there are fewer (unjoined_changed()).
  std::vector<PendingList::iterator> unjoined;
  int joined_members = 0;  // pending connections that have joined

  Gathering(const NodeGroupOptions& opts, FormedJob& j, sys::Fd l, Clock::time_point start)
      : o(opts),
        ep(endpoint_of(opts)),
        t0(start),
        deadline(start + opts.rdzv_timeout),
        elastic(is_elastic(opts.min_nnodes, opts.nnodes)),
        job(j),
        listener(std::move(l)),
        formation(opts.nnodes, opts.min_nnodes, opts.last_call, deadline) {
    poller().add(listener.get());
  }

  sys::Epoll& poller() { return job.links->poller(); }
  int joined() const { return 1 + joined_members; }
  [[noreturn]] void reject_all(const std::string& reason) {
    formation.reject();
    for (auto& p : pending) {
      try {
        p.link->send("reject", RejectMsg{reason});
      } catch (const LinkError&) {}
    }
    throw NodeRendezvousError(reason);
  }
  void say_waiting() const;
  void until_formed();
  void poll_once();
  void accept_some();
  void unjoined_changed(size_t before);
  bool read_pending(Joiner& p);  // false: drop it
  void drop(PendingList::iterator it);
  void settle_unjoined();
  std::vector<int> node_ranks();
  void fill_assignment(const std::vector<int>& rank, const std::string& own_addr, PortReservation own_port);
  void send_assignments(const std::vector<int>& rank);
};

void Gathering::say_waiting() const {
  if (elastic) {
    say(o, "rendezvous: waiting for " + std::to_string(o.min_nnodes - 1) + " to " + std::to_string(o.nnodes - 1) +
               " more nodes on " + ep + " (--nnodes " + nnodes_flag(o.min_nnodes, o.nnodes) + ", timeout " +
               seconds_text(o.rdzv_timeout) + ", last call " + seconds_text(o.last_call) + ")");
  } else {
    say(o, "rendezvous: waiting for " + std::to_string(o.nnodes - 1) + " more node" + (o.nnodes == 2 ? "" : "s") +
               " on " + ep + " (timeout " + seconds_text(o.rdzv_timeout) + ")");
  }
}

// Accepts and reads connections until the job forms (Formed); at the deadline without enough
// nodes (TimedOut), every pending one is rejected.
void Gathering::until_formed() {
  for (;;) {
    const int n = joined();
    for (RdzvState entered : formation.update(n, Clock::now())) {
      if (entered != RdzvState::LastCall) continue;
      say(o, "rendezvous: " + std::to_string(n) + (n == 1 ? " node" : " nodes") + " joined (--nnodes " +
                 nnodes_flag(o.min_nnodes, o.nnodes) + "): waiting " + seconds_text(o.last_call) +
                 " for more (last_call_timeout)");
    }
    if (formation.state() == RdzvState::Formed) return;
    if (formation.state() == RdzvState::TimedOut) {
      reject_all("rendezvous on " + ep + " timed out after " + seconds_text(o.rdzv_timeout) + ": " + std::to_string(n) +
                 "/" + std::to_string(elastic ? o.min_nnodes : o.nnodes) + " nodes joined" +
                 (elastic ? " (--nnodes " + nnodes_flag(o.min_nnodes, o.nnodes) + ")" : ""));
    }
    poll_once();
  }
}

// One wake-up: what is ready among the listener and the pending connections (the poller: the cost
// is the ready ones', not every connection's), then the unjoined ones past their time.
void Gathering::poll_once() {
  auto wake = formation.next_due();
  for (auto it : unjoined) wake = std::min(wake, join_due(it->accepted_at, o.node_timeout) + milliseconds(1));
  const auto now = Clock::now();
  const auto timeout = wake > now ? std::chrono::ceil<milliseconds>(wake - now) : milliseconds(0);
  for (int fd : poller().ready(std::min(timeout, milliseconds(86400000)))) {
    if (fd == listener.get()) {
      accept_some();
      continue;
    }
    auto found = by_fd.find(fd);
    if (found == by_fd.end()) continue;  // dropped meanwhile
    if (!read_pending(*found->second)) drop(found->second);
  }
  for (size_t i = 0; i < unjoined.size(); ++i) {
    if (Clock::now() <= join_due(unjoined[i]->accepted_at, o.node_timeout)) continue;
    say(o, join_overdue(ep, unjoined[i]->endpoint, o.node_timeout));
    drop(unjoined[i--]);
  }
}

// The listener is watched while fewer than kMaxUnjoined connections have sent no join: called
// after each change of `unjoined`, which had `before` elements.
void Gathering::unjoined_changed(size_t before) {
  const auto room = [](size_t n) { return n < static_cast<size_t>(kMaxUnjoined); };
  if (room(before) == room(unjoined.size())) return;
  if (room(unjoined.size())) {
    poller().add(listener.get());
  } else {
    poller().remove(listener.get());
  }
}

void Gathering::accept_some() {
  const size_t before = unjoined.size();
  const int room = kMaxUnjoined - static_cast<int>(before);
  accept_nodes(listener.get(), ep, o.node_timeout, room, [this](std::unique_ptr<Link> link, std::string endpoint) {
    const int fd = link->fd();
    auto it = pending.insert(pending.end(), Joiner{std::move(link), {}, std::move(endpoint), Clock::now()});
    by_fd.emplace(fd, it);
    unjoined.push_back(it);
    poller().add(fd);
  });
  unjoined_changed(before);
}

void Gathering::drop(PendingList::iterator it) {
  if (it->join) --joined_members;
  const size_t before = unjoined.size();
  unjoined.erase(std::remove(unjoined.begin(), unjoined.end(), it), unjoined.end());
  if (it->link) {
    poller().remove(it->link->fd());
    by_fd.erase(it->link->fd());
  }
  pending.erase(it);
  if (formation.gathering()) unjoined_changed(before);
}

// What came on a pending connection: its join, checked against this job and answered at once.
bool Gathering::read_pending(Joiner& p) {
  try {
    for (auto& m : p.link->read()) {
      if (m.type != "join" || p.join) continue;
      JoinMsg j = m.as<JoinMsg>();
      if (const std::string why = join_mismatch(o, j); !why.empty()) {
        reject_all("rendezvous on " + ep + ": " + p.link->peer() + " (" + j.host + ") " + why);
      }
      p.join = j;
      ++joined_members;
      const size_t before = unjoined.size();
      unjoined.erase(std::find_if(unjoined.begin(), unjoined.end(), [&](auto it) { return &*it == &p; }));
      unjoined_changed(before);
      p.link->set_peer(j.host + " (" + sys::peer_ip(p.link->fd()) + ")");
      p.link->send("joined", JoinedMsg{joined()});
    }
  } catch (const LinkError& e) {
    // It went away before the job formed (it is simply not part of it), or it is not an
    // lspawn: either way the rendezvous goes on without it. A node that had joined is said (it
    // no longer counts), as are bytes that are no frame of ours, naming the sender.
    if (p.join) {
      say(o, "rendezvous on " + ep + ": node " + p.link->peer() + " joined, then went away (" + e.what() + "); " +
                 std::to_string(joined() - 1) + " of " + std::to_string(o.nnodes) + " nodes joined now");
    } else if (not_our_frames(e)) {
      say(o, "rendezvous on " + ep + ": rejected connection from " + p.endpoint + ": " + e.what());
    }
    return false;
  } catch (const BadMessage& e) {
    // A frame of ours with a body that is no join message: a stranger (or a broken lspawn) is
    // turned away; the nodes that did join are not.
    say(o,
        "rendezvous on " + ep + ": rejected connection from " + p.endpoint + ": bad join message (" + e.what() + ")");
    try {
      p.link->send("reject", RejectMsg{"bad join message: " + std::string(e.what())});
    } catch (const LinkError&) {}
    return false;
  }
  return true;
}

// Connections that sent no join yet: an elastic job's next round may admit them; a fixed job has
// formed without them. The endpoint stays open for an elastic job's later nodes (job.listener);
// a fixed job's later lspawns get "connection refused".
void Gathering::settle_unjoined() {
  const bool listener_watched = unjoined.size() < static_cast<size_t>(kMaxUnjoined);
  for (auto it = pending.begin(); it != pending.end();) {
    auto next = std::next(it);
    if (it->join) {
      it = next;
      continue;
    }
    if (elastic) {  // it stays in the poller, as a joiner
      by_fd.erase(it->link->fd());
      job.unjoined.push_back(Joiner{std::move(it->link), {}, it->endpoint, it->accepted_at});
    } else {
      try {
        it->link->send("reject", RejectMsg{"the job on " + ep + " has formed without this node"});
      } catch (const LinkError&) {}
    }
    drop(it);
    it = next;
  }
  if (elastic) {
    job.listener = std::move(listener);
    job.listener_watched = listener_watched;
    job.endpoint = ep;
  } else {
    if (listener_watched) poller().remove(listener.get());
    listener.reset();
  }
}

// Node ranks by join position ([0]: the coordinator); a clash rejects every node.
std::vector<int> Gathering::node_ranks() {
  std::vector<int> given{o.node_rank};
  std::vector<std::string> who{o.host + " (this node)"};
  for (auto& p : pending) {
    given.push_back(p.join->node_rank);
    who.push_back(p.link->peer());
  }
  NodeRanks r = assign_node_ranks(given, who, o.nnodes);
  if (!r.problem.empty()) reject_all("rendezvous on " + ep + ": " + r.problem);
  return std::move(r.rank);
}

// The job's assignment: run id (given, a member's, else drawn), hosts by node rank, and the
// workers' master: this node's reserved port when it is node 0, else node 0's.
void Gathering::fill_assignment(const std::vector<int>& rank, const std::string& own_addr, PortReservation own_port) {
  AssignMsg& a = job.assign;
  const int formed_nodes = static_cast<int>(pending.size()) + 1;
  a.nnodes = formed_nodes;
  a.nproc_per_node = o.nproc_per_node;
  a.max_restarts = o.max_restarts;
  a.run_id = o.run_id;
  for (auto& p : pending)
    if (a.run_id.empty()) a.run_id = p.join->run_id;
  if (a.run_id.empty()) a.run_id = random_run_id();
  a.hosts.assign(static_cast<size_t>(formed_nodes), "");
  a.hosts[static_cast<size_t>(rank[0])] = o.host;
  size_t i = 1;
  for (auto& p : pending) a.hosts[static_cast<size_t>(rank[i++])] = p.join->host;
  if (rank[0] == 0) {
    a.master_addr = own_addr;
    a.master_port = own_port.port();
    job.master_port.emplace(std::move(own_port));
  } else {
    i = 1;
    for (auto& p : pending) {
      if (rank[i++] != 0) continue;
      if (p.join->worker_port == 0) {
        reject_all("rendezvous on " + ep + ": node 0 (" + p.link->peer() + ") reserved no port for the workers");
      }
      a.master_addr = p.join->worker_addr;
      a.master_port = p.join->worker_port;
    }
  }
  a.coordinator = rank[0];
}

// Each member its assignment (the hosts list encoded once for all: AssignBodies); one whose
// connection broke meanwhile is handed to the node group as lost (job.broken).
void Gathering::send_assignments(const std::vector<int>& rank) {
  const AssignBodies bodies(job.assign);
  size_t i = 1;
  for (auto& p : pending) {
    auto n = std::make_unique<NodeLink>();
    n->node_rank = rank[i++];
    n->host = p.join->host;
    n->addr = sys::peer_ip(p.link->fd());
    n->link = std::move(p.link);
    n->link->set_peer("node " + std::to_string(n->node_rank) + " (" + n->host + ", " + n->addr + ")");
    NodeLink& added = job.links->add(std::move(n), false);  // watched since its accept
    try {
      added.link->send("assign", bodies.for_node(added.node_rank));
    } catch (const LinkError& e) {
      job.broken.emplace_back(&added, e.what());
    }
  }
  pending.clear();
  by_fd.clear();
  unjoined.clear();
  job.links->flush_soon();  // an assignment names every host: the socket may not take it at once
  job.assign.node_rank = rank[0];
  for (auto& n : job.links->nodes()) n->link->touch();
}

FormedJob form_coordinator(const NodeGroupOptions& o, sys::Fd listener, Clock::time_point t0) {
  FormedJob job;
  job.coordinator = true;
  job.links = std::make_unique<Links>();
  Gathering r(o, job, std::move(listener), t0);
  r.say_waiting();
  // A port for the workers' store on this host, in case this node is node 0.
  const std::string own_addr = !o.static_mode && !o.local_addr.empty() ? o.local_addr : o.endpoint_addr;
  PortReservation own_port(own_addr, 0);
  r.until_formed();
  r.settle_unjoined();
  const std::vector<int> rank = r.node_ranks();
  r.fill_assignment(rank, own_addr, std::move(own_port));
  r.send_assignments(rank);
  const int formed_nodes = job.assign.nnodes;
  job.formed_line = "rendezvous: " + std::to_string(formed_nodes) + " node" + (formed_nodes == 1 ? "" : "s") +
                    " joined after " + elapsed_text(Clock::now() - t0);
  return job;
}

FormedJob form_solo(const NodeGroupOptions& o, int master_port) {
  FormedJob job;
  job.coordinator = true;
  job.links = std::make_unique<Links>();
  job.master_port.emplace(o.endpoint_addr, master_port);
  AssignMsg& a = job.assign;
  a.node_rank = 0;
  a.nnodes = 1;
  a.nproc_per_node = o.nproc_per_node;
  a.max_restarts = o.max_restarts;
  a.run_id = o.run_id.empty() ? random_run_id() : o.run_id;
  a.master_addr = o.endpoint_addr;
  a.master_port = job.master_port->port();
  a.hosts = {o.host};
  return job;
}

}  // namespace

FormedJob rendezvous(const NodeGroupOptions& o, int solo_master_port) {
  if (o.nnodes == 1) return form_solo(o, solo_master_port);
  Attempts tries(o);
  milliseconds backoff(20);
  for (;;) {
    if (!o.static_mode || o.node_rank == 0) {
      int err = 0;
      sys::Fd listener = sys::tcp_listen(o.endpoint_addr, o.endpoint_port, &err);
      if (listener) {
        sys::raise_listen_backlog(listener.get(), "rendezvous on " + tries.ep);
        return form_coordinator(o, std::move(listener), tries.t0);
      }
      if (o.static_mode) {
        throw PortError(tries.ep + (err == EADDRINUSE ? " is already in use" : " is not an address of this host") +
                            " (bind: " + std::strerror(err) + "); node 0 listens there for the other nodes",
                        err);
      }
      tries.cannot_host(err);
    }
    Joining joining;
    if (joining.try_join(o, tries)) return form_member(o, std::move(joining), tries.t0);
    tries.report_if_due();
    if (Clock::now() + backoff >= tries.deadline) {  // no time for another try: the timeout, on time
      std::this_thread::sleep_until(tries.deadline);
      tries.timed_out();
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

}  // namespace lspawn::node
