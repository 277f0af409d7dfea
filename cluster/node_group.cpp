#include "cluster/node_group.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <poll.h>

#include "cluster/membership.hpp"
#include "sys/duration_text.hpp"
#include "sys/exit_codes.hpp"
#include "supervisor/job_secret.hpp"

namespace lspawn::node {

struct Group::Node {
  int node_rank = -1;
  std::string host;
  std::string addr;
  std::unique_ptr<Link> link;  // null once lost
  bool done = false;           // this round
  Clock::time_point busy_until{};  // its announced silence (BusyMsg) ends then
};

// A connection to an elastic job's endpoint after it formed: a node that wants to join.
struct Group::Joiner {
  std::unique_ptr<Link> link;
  std::optional<JoinMsg> join;  // accepted; it waits for the next round
  std::string endpoint;         // "IP:PORT" of the peer
  Clock::time_point accepted_at;
};

namespace {

using std::chrono::milliseconds;

// "3 s": a duration rounded to whole seconds, for what is said while the rendezvous goes on
// (a countdown: sys/duration_text.hpp's elapsed_text would say "2.9 s").
std::string whole_seconds(Clock::duration d) {
  return seconds_text(std::chrono::seconds(std::llround(std::max(std::chrono::duration<double>(d).count(), 0.0))));
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "process 3 terminated with exit code 7" out of "lspawn: root cause: process 3 ...\n...".
std::string first_line(const std::string& text) {
  std::string l = text.substr(0, text.find('\n'));
  for (const char* p : {"lspawn: ", "root cause: "}) {
    if (l.rfind(p, 0) == 0) l = l.substr(std::strlen(p));
  }
  return l;
}

// --nnodes MIN:MAX with MIN < MAX (min_nnodes 0: a fixed count).
bool is_elastic(int min_nnodes, int nnodes) { return min_nnodes > 0 && min_nnodes < nnodes; }

std::string nnodes_flag(int min_nnodes, int nnodes) {
  return is_elastic(min_nnodes, nnodes) ? std::to_string(min_nnodes) + ":" + std::to_string(nnodes)
                                        : std::to_string(nnodes);
}

// A connection whose bytes are no frame of the channel's (not an lspawn): said, naming the sender.
bool not_our_frames(const LinkError& e) {
  const std::string why = e.what();
  return why.rfind("bad frame", 0) == 0 || why.rfind("connection closed inside a frame", 0) == 0;
}

// Connections to the rendezvous endpoint that have not sent their join message yet: at most
// this many at a time (more are closed as they come), each for at most --node-timeout. A real
// lspawn joins as soon as it connects; without these bounds a port scanner or a stuck peer would
// hold the coordinator's fds for the whole job.
constexpr int kMaxUnjoined = 64;

// Accepts the connections waiting on `listener` (the rendezvous endpoint `ep`): `add` gets the
// first `max` ones' links ("node at IP") and "IP:PORT". Beyond `max`: with `beyond` null, the
// rest stay in the kernel's backlog; else each is accepted, given to `beyond` ("IP:PORT") and
// closed.
void accept_nodes(int listener, const std::string& ep, milliseconds node_timeout, int max,
                  const std::function<void(std::unique_ptr<Link>, std::string)>& add,
                  const std::function<void(const std::string&)>& beyond = {}) {
  for (int i = 0;; ++i) {
    if (i >= max && !beyond) return;
    sys::Fd fd = sys::tcp_accept(listener, "rendezvous on " + ep);
    if (!fd) return;
    std::string endpoint = sys::peer_endpoint(fd.get());
    if (i >= max) {
      beyond(endpoint);
      continue;  // fd closes here
    }
    sys::tcp_set_liveness(fd.get(), node_timeout, "rendezvous on " + ep);
    const std::string peer = sys::peer_ip(fd.get());
    add(std::make_unique<Link>(std::move(fd), "node at " + peer), std::move(endpoint));
  }
}

// When a connection accepted at `accepted_at` that has sent no join message is closed: once the
// clock is past it. (A wake-up for it is 1 ms later, to be past it.)
Clock::time_point join_due(Clock::time_point accepted_at, milliseconds node_timeout) {
  return accepted_at + node_timeout;
}

// A connection that has sent no join message within --node-timeout of its accept: what is said
// when it is closed.
std::string join_overdue(const std::string& ep, const std::string& endpoint, milliseconds node_timeout) {
  return "rendezvous on " + ep + ": closed connection from " + endpoint + ": no join message within " +
         seconds_text(node_timeout) + " (--node-timeout)";
}

// Why `j` cannot be part of the job `o` describes; empty when it can.
std::string join_mismatch(const GroupOptions& o, const JoinMsg& j) {
  const auto min_of = [](int min, int max) { return is_elastic(min, max) ? min : 0; };
  if (j.version != kProtocolVersion) {
    return "speaks control protocol " + std::to_string(j.version) + ", this lspawn " +
           std::to_string(kProtocolVersion);
  }
  if (j.nnodes != o.nnodes || min_of(j.min_nnodes, j.nnodes) != min_of(o.min_nnodes, o.nnodes)) {
    return "has --nnodes " + nnodes_flag(j.min_nnodes, j.nnodes) + ", node 0 " + nnodes_flag(o.min_nnodes, o.nnodes);
  }
  if (j.nproc_per_node != o.nproc_per_node) {
    return "has --nproc-per-node " + std::to_string(j.nproc_per_node) + ", this node " +
           std::to_string(o.nproc_per_node) + " (every node must run the same number)";
  }
  if (!j.run_id.empty() && !o.run_id.empty() && j.run_id != o.run_id) {
    return "has run id '" + j.run_id + "', this node '" + o.run_id + "'";
  }
  if (j.max_restarts != o.max_restarts) {
    return "has --max-restarts " + std::to_string(j.max_restarts) + ", this node " + std::to_string(o.max_restarts);
  }
  if (is_elastic(o.min_nnodes, o.nnodes) && j.node_rank >= 0) {
    return "has --node-rank " + std::to_string(j.node_rank) + ": an elastic job numbers its nodes itself";
  }
  return "";
}

int poll_fds(std::vector<pollfd>& pfds, Clock::time_point deadline) {
  const auto now = Clock::now();
  int timeout = 0;
  if (deadline > now) {
    timeout = static_cast<int>(
        std::min<long long>(std::chrono::ceil<milliseconds>(deadline - now).count(), 86400000LL));
  }
  int n = ::poll(pfds.data(), pfds.size(), timeout);
  if (n < 0 && errno != EINTR) sys::throw_errno("poll", "control channel");
  return n < 0 ? 0 : n;
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

std::string endpoint_of(const GroupOptions& o) { return o.endpoint_addr + ":" + std::to_string(o.endpoint_port); }

// A node that is not the coordinator (yet): what it tried and what answered, said 3 s after the
// rendezvous began and then every 5 s while it tries again, and named by the timeout's error.
struct Attempts {
  static constexpr milliseconds kFirstReport{3000};
  static constexpr milliseconds kReportEvery{5000};
  static constexpr milliseconds kAnswerWait{3000};  // a coordinator answers a join at once

  const GroupOptions& o;
  const std::string ep;
  const Clock::time_point t0;
  const Clock::time_point deadline;
  std::string host_problem;  // --rdzv-endpoint mode: why this node cannot host ("bind: ...")
  std::string join_problem;  // why it could not join ("connect: ...", "EP accepted ...")
  Clock::time_point next_report;

  explicit Attempts(const GroupOptions& opts)
      : o(opts), ep(endpoint_of(opts)), t0(Clock::now()), deadline(t0 + opts.rdzv_timeout),
        next_report(t0 + kFirstReport) {}

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
    if (o.info) {
      o.info("rendezvous on " + ep + ": " + what_failed() + "; still trying (" + whole_seconds(deadline - now) +
             " of --rdzv-timeout " + seconds_text(o.rdzv_timeout) + " left)");
    }
  }
  [[noreturn]] void timed_out() const {
    throw RendezvousError("rendezvous on " + ep + " timed out after " + seconds_text(o.rdzv_timeout) + ": " + what_failed());
  }
};

}  // namespace


Group::~Group() = default;

void Group::info(const std::string& line) const {
  if (opts_.info) opts_.info(line);
}

milliseconds heartbeat_interval(int nnodes, milliseconds node_timeout) {
  const milliseconds budget = std::max(milliseconds(1000), milliseconds(nnodes));
  return std::max(std::min(budget, node_timeout / 4), milliseconds(20));
}

milliseconds status_interval(int nnodes) { return std::max(milliseconds(250), milliseconds(nnodes)); }

milliseconds Group::heartbeat_interval() const { return node::heartbeat_interval(assign_.nnodes, opts_.node_timeout); }

milliseconds Group::status_interval() const { return node::status_interval(assign_.nnodes); }

bool Group::enter(RoundEvent e) {
  const std::optional<RoundState> next = next_round_state(state_, e);
  if (!next) return false;
  state_ = *next;
  return true;
}

// ---- Forming ---------------------------------------------------------------------------------

// A member's connection to the coordinator once it has answered the join ("joined", or the
// assignment at once).
struct Group::Joining {
  // One try: connect, send the join, wait for the answer. False: nothing that answers a join
  // is there (tries.join_problem says what was). Throws RendezvousError (a reject, the timeout).
  bool try_join(const GroupOptions& o, Attempts& tries);

  std::unique_ptr<Link> link;
  std::vector<Message> queue;  // read after the answer
  std::optional<PortReservation> own_port;  // --rdzv-endpoint mode: the workers' port, should it be node 0
  int joined = 0;  // nodes that had joined when it answered (JoinedMsg); 0: not said
};

namespace {

JoinMsg join_of(const GroupOptions& o) {
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
      tries.join_problem = not_our_frames(e) ? tries.ep + " answered with bytes that are no lspawn message (" + e.what() + ")"
                                             : tries.ep + " accepted the connection and closed it without answering (" +
                                                   e.what() + ")";
      return false;
    }
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->type == "reject") throw RendezvousError(it->as<RejectMsg>().reason);
      if (it->type == "assign") return true;
      if (it->type == "joined") {
        *joined = it->as<JoinedMsg>().joined;
        queue.erase(it);
        return true;
      }
    }
  }
}

}  // namespace

bool Group::Joining::try_join(const GroupOptions& o, Attempts& tries) {
  const auto left = std::chrono::duration_cast<milliseconds>(tries.deadline - Clock::now());
  int err = 0;
  sys::Fd fd;
  try {
    fd = sys::tcp_connect(o.endpoint_addr, o.endpoint_port, std::min(left, milliseconds(2000)), &err);
  } catch (const sys::SysError& e) {
    throw RendezvousError("rendezvous on " + tries.ep + ": " + e.what());
  }
  if (!fd) {
    tries.join_problem = std::string("connect: ") + std::strerror(err);
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
    throw RendezvousError("rendezvous on " + tries.ep + ": bad message from the coordinator: " + e.what());
  }
  link.reset();
  return false;
}

std::unique_ptr<Group> Group::form(const GroupOptions& o, int solo_master_port) {
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

std::unique_ptr<Group> Group::form_solo(const GroupOptions& o, int master_port) {
  std::unique_ptr<Group> g(new Group());
  g->opts_ = o;
  g->coordinator_ = true;
  g->master_port_.emplace(o.endpoint_addr, master_port);
  g->assign_.node_rank = 0;
  g->assign_.nnodes = 1;
  g->assign_.nproc_per_node = o.nproc_per_node;
  g->assign_.max_restarts = o.max_restarts;
  g->assign_.run_id = o.run_id.empty() ? random_run_id() : o.run_id;
  g->assign_.master_addr = o.endpoint_addr;
  g->assign_.master_port = g->master_port_->port();
  g->assign_.hosts = {o.host};
  return g;
}

// The coordinator's rendezvous, one step per function over this state: the connections that came
// (pending) until the job forms, then their node ranks and assignments.
struct Group::Gathering {
  struct Pending {
    std::unique_ptr<Link> link;
    std::vector<Message> queue;
    std::optional<JoinMsg> join;
    std::string endpoint;  // "IP:PORT" of the peer, for what is said about a stranger
    Clock::time_point accepted_at;
  };
  using PendingList = std::list<Pending>;  // in accept order; an element stays where it is

  Group& g;
  const GroupOptions& o;
  const std::string ep;
  const Clock::time_point t0;
  const Clock::time_point deadline;
  const bool elastic;
  sys::Fd listener;
  Formation formation;
  PendingList pending;
  std::unordered_map<int, PendingList::iterator> by_fd;  // the pending connections by fd
  std::vector<PendingList::iterator> unjoined;  // accepted, no join yet: at most kMaxUnjoined
  int joined_members = 0;                       // pending connections that have joined
  bool accepting = false;                       // the listener is in g.poller_

  Gathering(Group& group, const GroupOptions& opts, sys::Fd l, Clock::time_point start)
      : g(group), o(opts), ep(endpoint_of(opts)), t0(start), deadline(start + opts.rdzv_timeout),
        elastic(is_elastic(opts.min_nnodes, opts.nnodes)), listener(std::move(l)),
        formation(opts.nnodes, opts.min_nnodes, opts.last_call, deadline) {}

  int joined() const { return 1 + joined_members; }
  [[noreturn]] void reject_all(const std::string& reason) {
    for (auto& p : pending) {
      try {
        p.link->send("reject", RejectMsg{reason});
      } catch (const LinkError&) {
      }
    }
    throw RendezvousError(reason);
  }
  void say_waiting() const;
  void until_formed();
  void poll_once();
  void accept_some();
  bool read_pending(Pending& p);  // false: drop it
  void drop(PendingList::iterator it);
  void settle_unjoined();
  std::vector<int> node_ranks();
  void fill_assignment(const std::vector<int>& rank, const std::string& own_addr, PortReservation own_port);
  void send_assignments(const std::vector<int>& rank);
};

void Group::Gathering::say_waiting() const {
  if (elastic) {
    g.info("rendezvous: waiting for " + std::to_string(o.min_nnodes - 1) + " to " + std::to_string(o.nnodes - 1) +
           " more nodes on " + ep + " (--nnodes " + nnodes_flag(o.min_nnodes, o.nnodes) + ", timeout " +
           seconds_text(o.rdzv_timeout) + ", last call " + seconds_text(o.last_call) + ")");
  } else {
    g.info("rendezvous: waiting for " + std::to_string(o.nnodes - 1) + " more node" + (o.nnodes == 2 ? "" : "s") +
           " on " + ep + " (timeout " + seconds_text(o.rdzv_timeout) + ")");
  }
}

// Accepts and reads connections until the job forms (membership.hpp's Formation); at the
// deadline without enough nodes, every pending one is rejected.
void Group::Gathering::until_formed() {
  for (;;) {
    const int n = joined();
    const Formation::Check c = formation.check(n, Clock::now());
    if (c.last_call_began) {
      g.info("rendezvous: " + std::to_string(n) + (n == 1 ? " node" : " nodes") + " joined (--nnodes " +
             nnodes_flag(o.min_nnodes, o.nnodes) + "): waiting " + seconds_text(o.last_call) +
             " for more (last_call_timeout)");
    }
    if (c.formed) return;
    if (c.timed_out) {
      reject_all("rendezvous on " + ep + " timed out after " + seconds_text(o.rdzv_timeout) + ": " + std::to_string(n) +
                 "/" + std::to_string(elastic ? o.min_nnodes : o.nnodes) + " nodes joined" +
                 (elastic ? " (--nnodes " + nnodes_flag(o.min_nnodes, o.nnodes) + ")" : ""));
    }
    poll_once();
  }
}

// One wake-up: what is ready among the listener and the pending connections (g.poller_: the cost
// is the ready ones', not every connection's), then the unjoined ones past their time. While
// kMaxUnjoined connections have sent no join, the listener is not watched: the next ones wait in
// the kernel's backlog (a thousand nodes connecting at once all get in, none is turned away).
void Group::Gathering::poll_once() {
  const bool room = static_cast<int>(unjoined.size()) < kMaxUnjoined;
  if (room != accepting) {
    if (room) {
      g.poller_.add(listener.get());
    } else {
      g.poller_.remove(listener.get());
    }
    accepting = room;
  }
  auto wake = formation.next_due();
  for (auto it : unjoined) wake = std::min(wake, join_due(it->accepted_at, o.node_timeout) + milliseconds(1));
  const auto now = Clock::now();
  const auto timeout = wake > now ? std::chrono::ceil<milliseconds>(wake - now) : milliseconds(0);
  for (int fd : g.poller_.ready(std::min(timeout, milliseconds(86400000)))) {
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
    g.info(join_overdue(ep, unjoined[i]->endpoint, o.node_timeout));
    drop(unjoined[i--]);
  }
}

void Group::Gathering::accept_some() {
  const int room = kMaxUnjoined - static_cast<int>(unjoined.size());
  accept_nodes(listener.get(), ep, o.node_timeout, room, [this](std::unique_ptr<Link> link, std::string endpoint) {
    const int fd = link->fd();
    auto it = pending.insert(pending.end(), Pending{std::move(link), {}, {}, std::move(endpoint), Clock::now()});
    by_fd.emplace(fd, it);
    unjoined.push_back(it);
    g.poller_.add(fd);
  });
}

void Group::Gathering::drop(PendingList::iterator it) {
  if (it->join) --joined_members;
  unjoined.erase(std::remove(unjoined.begin(), unjoined.end(), it), unjoined.end());
  if (it->link) {
    g.poller_.remove(it->link->fd());
    by_fd.erase(it->link->fd());
  }
  pending.erase(it);
}

// What came on a pending connection: its join, checked against this job and answered at once.
bool Group::Gathering::read_pending(Pending& p) {
  try {
    for (auto& m : p.link->read()) p.queue.push_back(std::move(m));
    for (auto& m : p.queue) {
      if (m.type != "join" || p.join) continue;
      JoinMsg j = m.as<JoinMsg>();
      if (const std::string why = join_mismatch(o, j); !why.empty()) {
        reject_all("rendezvous on " + ep + ": " + p.link->peer() + " (" + j.host + ") " + why);
      }
      p.join = j;
      ++joined_members;
      unjoined.erase(std::find_if(unjoined.begin(), unjoined.end(), [&](auto it) { return &*it == &p; }));
      p.link->set_peer(j.host + " (" + sys::peer_ip(p.link->fd()) + ")");
      p.link->send("joined", JoinedMsg{joined()});
    }
    p.queue.clear();
  } catch (const LinkError& e) {
    // It went away before the job formed (it is simply not part of it), or it is not an
    // lspawn: either way the rendezvous goes on without it. Bytes that are no frame of ours
    // are said, naming the sender.
    if (not_our_frames(e)) g.info("rendezvous on " + ep + ": rejected connection from " + p.endpoint + ": " + e.what());
    return false;
  } catch (const BadMessage& e) {
    // A frame of ours with a body that is no join message: a stranger (or a broken lspawn) is
    // turned away; the nodes that did join are not.
    g.info("rendezvous on " + ep + ": rejected connection from " + p.endpoint + ": bad join message (" + e.what() + ")");
    try {
      p.link->send("reject", RejectMsg{"bad join message: " + std::string(e.what())});
    } catch (const LinkError&) {
    }
    return false;
  }
  return true;
}

// Connections that sent no join yet: an elastic job's next round may admit them; a fixed job has
// formed without them. The endpoint stays open for an elastic job's later nodes; a fixed job's
// later lspawns get "connection refused".
void Group::Gathering::settle_unjoined() {
  for (auto it = pending.begin(); it != pending.end();) {
    auto next = std::next(it);
    if (it->join) {
      it = next;
      continue;
    }
    if (elastic) {  // it stays in g.poller_, as a joiner
      by_fd.erase(it->link->fd());
      g.joiners_.push_back(std::make_unique<Joiner>(Joiner{std::move(it->link), {}, it->endpoint, it->accepted_at}));
    } else {
      try {
        it->link->send("reject", RejectMsg{"the job on " + ep + " has formed without this node"});
      } catch (const LinkError&) {
      }
    }
    drop(it);
    it = next;
  }
  if (elastic) {
    if (!accepting) g.poller_.add(listener.get());
    g.listener_ = std::move(listener);
  } else {
    if (accepting) g.poller_.remove(listener.get());
    listener.reset();
  }
}

// Node ranks by join position ([0]: the coordinator); a clash rejects every node.
std::vector<int> Group::Gathering::node_ranks() {
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
void Group::Gathering::fill_assignment(const std::vector<int>& rank, const std::string& own_addr,
                                       PortReservation own_port) {
  AssignMsg& a = g.assign_;
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
    g.master_port_.emplace(std::move(own_port));
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
// connection broke meanwhile is lost at once.
void Group::Gathering::send_assignments(const std::vector<int>& rank) {
  const AssignBodies bodies(g.assign_);
  std::vector<std::pair<Node*, std::string>> broken;
  size_t i = 1;
  for (auto& p : pending) {
    auto n = std::make_unique<Node>();
    n->node_rank = rank[i++];
    n->host = p.join->host;
    n->addr = sys::peer_ip(p.link->fd());
    n->link = std::move(p.link);
    n->link->set_peer("node " + std::to_string(n->node_rank) + " (" + n->host + ", " + n->addr + ")");
    g.by_fd_[n->link->fd()] = n.get();  // watched since its accept
    try {
      n->link->send("assign", bodies.for_node(n->node_rank));
    } catch (const LinkError& e) {
      broken.emplace_back(n.get(), e.what());
    }
    g.nodes_.push_back(std::move(n));
  }
  pending.clear();
  by_fd.clear();
  unjoined.clear();
  g.flush_soon_ = true;  // an assignment names every host: the socket may not take it at once
  g.assign_.node_rank = rank[0];
  for (auto& n : g.nodes_) n->link->touch();
  for (auto& [n, why] : broken) g.lost(*n, "its connection broke during the rendezvous (" + why + ")");
}

std::unique_ptr<Group> Group::form_coordinator(const GroupOptions& o, sys::Fd listener, Clock::time_point t0) {
  std::unique_ptr<Group> g(new Group());
  g->opts_ = o;
  g->coordinator_ = true;
  Gathering r(*g, o, std::move(listener), t0);
  g->endpoint_ = r.ep;
  r.say_waiting();
  // A port for the workers' store on this host, in case this node is node 0.
  const std::string own_addr = !o.static_mode && !o.local_addr.empty() ? o.local_addr : o.endpoint_addr;
  PortReservation own_port(own_addr, 0);
  r.until_formed();
  r.settle_unjoined();
  const std::vector<int> rank = r.node_ranks();
  r.fill_assignment(rank, own_addr, std::move(own_port));
  r.send_assignments(rank);
  const int formed_nodes = g->assign_.nnodes;
  g->info("rendezvous: " + std::to_string(formed_nodes) + " node" + (formed_nodes == 1 ? "" : "s") + " joined after " +
          elapsed_text(Clock::now() - t0));
  return g;
}

// A member whose join was answered: waits for its assignment (until the rendezvous deadline).
std::unique_ptr<Group> Group::form_member(const GroupOptions& o, Joining joining, Clock::time_point t0) {
  std::unique_ptr<Group> g(new Group());
  g->opts_ = o;
  g->coordinator_ = false;
  const auto deadline = t0 + o.rdzv_timeout;
  const std::string ep = endpoint_of(o);
  auto node = std::make_unique<Node>();
  node->addr = sys::peer_ip(joining.link->fd());
  node->link = std::move(joining.link);
  std::vector<Message>& queue = joining.queue;
  try {
    for (;;) {
      auto m = read_one(*node->link, queue, deadline);
      if (!m) {
        throw RendezvousError("rendezvous on " + ep + " timed out after " + seconds_text(o.rdzv_timeout) +
                              " waiting for the other nodes" +
                              (joining.joined > 0 ? " (" + std::to_string(joining.joined) +
                                                        " had joined when this node did)"
                                                  : ""));
      }
      if (m->type == "reject") throw RendezvousError(m->as<RejectMsg>().reason);
      if (m->type != "assign") continue;
      g->assign_ = m->as<AssignMsg>();
      break;
    }
  } catch (const LinkError& e) {
    throw RendezvousError("rendezvous on " + ep + ": lost the connection to the coordinator (" + e.what() + ")");
  } catch (const BadMessage& e) {
    throw RendezvousError("rendezvous on " + ep + ": bad message from the coordinator: " + e.what());
  }
  if (g->assign_.node_rank == 0 && joining.own_port) g->master_port_.emplace(std::move(*joining.own_port));
  const int coord_rank = g->assign_.coordinator;
  if (coord_rank < 0 || coord_rank >= g->assign_.nnodes ||
      g->assign_.hosts.size() != static_cast<size_t>(g->assign_.nnodes) || g->assign_.node_rank < 0 ||
      g->assign_.node_rank >= g->assign_.nnodes) {
    throw RendezvousError("rendezvous on " + ep + ": inconsistent assignment from the coordinator");
  }
  g->round_ = g->assign_.restart_count;  // a node admitted to a running elastic job: its round
  g->restarts_used_ = g->assign_.restarts_used;
  node->node_rank = coord_rank;
  node->host = g->assign_.hosts[static_cast<size_t>(coord_rank)];
  node->link->set_peer("the coordinator (" + node->host + ", " + ep + ")");
  node->link->touch();
  g->watch(*node);
  for (auto& m : queue) g->handle(*node, m);
  g->nodes_.push_back(std::move(node));
  g->info("rendezvous: node " + std::to_string(g->assign_.node_rank) + " of " + std::to_string(g->assign_.nnodes) +
          " after " + elapsed_text(Clock::now() - t0));
  return g;
}

// ---- The job's rounds ------------------------------------------------------------------------

bool Group::elastic() const { return is_elastic(opts_.min_nnodes, opts_.nnodes); }

std::string Group::nnodes_text() const { return nnodes_flag(opts_.min_nnodes, opts_.nnodes); }

int Group::nodes_alive() const {
  int n = 1;  // the coordinator
  for (auto& node : nodes_) n += node->link != nullptr;
  return n;
}

// A formed elastic job's endpoint stays watched: connections beyond kMaxUnjoined without a join
// are closed at once (said the first time), so strangers cannot hold the coordinator's fds.
void Group::accept_joiners() {
  const int unjoined = static_cast<int>(joiners_.size()) - waiting_joiners();
  accept_nodes(
      listener_.get(), endpoint_, opts_.node_timeout, std::max(kMaxUnjoined - unjoined, 0),
      [this](std::unique_ptr<Link> link, std::string endpoint) {
        poller_.add(link->fd());
        joiners_.push_back(std::make_unique<Joiner>(Joiner{std::move(link), {}, std::move(endpoint), Clock::now()}));
      },
      [this](const std::string& endpoint) {
        if (unjoined_full_said_) return;
        info("rendezvous on " + endpoint_ + ": closed connection from " + endpoint + ": " + std::to_string(kMaxUnjoined) +
             " connections have not sent a join message yet, the most there may be (further ones are closed "
             "without a word)");
        unjoined_full_said_ = true;
      });
}

int Group::waiting_joiners() const {
  int n = 0;
  for (auto& j : joiners_) n += j->join.has_value();
  return n;
}

// A node that wants to join a formed elastic job: checked as at the rendezvous; accepted (and
// answered), it waits for the next round, which begins at once unless the round is ending
// already (a failure) or some node's workers are done (the job may be about to succeed).
// Returns why it is turned away, or "".
std::string Group::admit_or_refuse(Joiner& jn, const JoinMsg& j) {
  if (std::string why = join_mismatch(opts_, j); !why.empty()) return jn.link->peer() + " (" + j.host + ") " + why;
  if (finish_) return jn.link->peer() + " (" + j.host + ") came after the job ended";
  if (nodes_alive() + waiting_joiners() >= opts_.nnodes) {
    return jn.link->peer() + " (" + j.host + ") cannot join: the job has its --nnodes " + nnodes_text() +
           " maximum of " + std::to_string(opts_.nnodes) + " nodes";
  }
  jn.join = j;
  jn.link->set_peer(j.host + " (" + sys::peer_ip(jn.link->fd()) + ")");
  jn.link->send("joined", JoinedMsg{nodes_alive() + waiting_joiners()});
  bool some_done = local_done_;
  for (auto& n : nodes_) some_done = some_done || (n->link && n->done);
  if (state_ != RoundState::Running || some_done) {
    info("node " + jn.link->peer() + " wants to join: it is admitted if the job goes on to a next round");
    return "";
  }
  Cause c;
  c.kind = "membership";
  c.restart_count = round_;
  c.host = j.host;
  c.exit_code = 0;
  c.time_us = now_us();
  c.text = "lspawn: root cause: a new node, " + jn.link->peer() + ", joined the job (--nnodes " + nnodes_text() +
           "): the next round admits it\n";
  coordinator_failure(c);
  return "";
}

void Group::on_joiner_readable(size_t i) {
  Joiner& jn = *joiners_[i];
  std::string turned_away;  // said to the peer and here
  try {
    for (auto& m : jn.link->read()) {
      if (m.type != "join" || jn.join) continue;
      turned_away = admit_or_refuse(jn, m.as<JoinMsg>());
      break;
    }
  } catch (const LinkError& e) {
    // Gone (said when it had joined), or not an lspawn (said as at the rendezvous).
    if (jn.join) {
      info("node " + jn.link->peer() + ", waiting to join, went away: " + e.what());
    } else if (not_our_frames(e)) {
      info("rendezvous on " + endpoint_ + ": rejected connection from " + jn.endpoint + ": " + e.what());
    }
    drop_joiner(i);
    return;
  } catch (const BadMessage& e) {
    turned_away = "connection from " + jn.endpoint + ": bad join message (" + e.what() + ")";
  }
  if (turned_away.empty()) return;
  info("rendezvous on " + endpoint_ + ": rejected " + turned_away);
  try {
    jn.link->send("reject", RejectMsg{"rendezvous on " + endpoint_ + ": " + turned_away});
  } catch (const LinkError&) {
  }
  drop_joiner(i);
}

void Group::drop_joiner(size_t i) {
  poller_.remove(joiners_[i]->link->fd());
  joiners_.erase(joiners_.begin() + static_cast<long>(i));
}

void Group::watch(Node& n) {
  poller_.add(n.link->fd());
  by_fd_[n.link->fd()] = &n;
}

void Group::drop_link(Node& n) {
  if (!n.link) return;
  poller_.remove(n.link->fd());
  by_fd_.erase(n.link->fd());
  n.link.reset();
}

void Group::on_readable() {
  for (int fd : poller_.ready(milliseconds(0), kReadyPerCall)) {
    if (listener_ && fd == listener_.get()) {
      accept_joiners();
      continue;
    }
    if (auto it = by_fd_.find(fd); it != by_fd_.end()) {
      read_node(*it->second);
      continue;
    }
    for (size_t i = 0; i < joiners_.size(); ++i) {  // a few at most (kMaxUnjoined)
      if (joiners_[i]->link->fd() != fd) continue;
      on_joiner_readable(i);
      break;
    }
  }
}

void Group::read_node(Node& n) {
  try {
    for (auto& m : n.link->read()) {
      handle(n, m);
      if (!n.link) return;
    }
  } catch (const LinkError& e) {
    lost(n, e.what());
  } catch (const BadMessage& e) {
    lost(n, std::string("bad message: ") + e.what());
  }
}

void Group::handle(Node& n, const Message& m) {
  n.busy_until = m.type == "busy" ? Clock::now() + milliseconds(std::max<int64_t>(m.as<BusyMsg>().ms, 0))
                                  : Clock::time_point{};
  if (m.type == "hb" || m.type == "busy") return;
  if (m.type == "status" || m.type == "stacks?" || m.type == "stacks") {
    if (opts_.on_hang_message) opts_.on_hang_message(n.node_rank, m);
    return;
  }
  if (!coordinator_) {
    handle_member_message(m);
    return;
  }
  if (m.type == "failed") {
    Cause c = m.as<FailedMsg>().cause;
    if (c.restart_count == round_) coordinator_failure(c);
  } else if (m.type == "done") {
    auto d = m.as<DoneMsg>();
    if (d.restart_count == round_) node_done(n.node_rank, d.failed, d.cause);
  }
}

void Group::handle_member_message(const Message& m) {
  if (m.type == "stop") {
    on_stop(m.as<StopMsg>());
  } else if (m.type == "assign") {
    // An elastic job's next round changes the nodes: this node's new place (its "start" follows).
    const AssignMsg a = m.as<AssignMsg>();
    if (a.node_rank < 0 || a.node_rank >= a.nnodes || a.hosts.size() != static_cast<size_t>(a.nnodes) ||
        a.coordinator != assign_.coordinator) {
      throw BadMessage("inconsistent assignment for round " + std::to_string(a.restart_count));
    }
    assign_ = a;
  } else if (m.type == "start") {
    on_start(m.as<StartMsg>());
  } else if (m.type == "finish") {
    finish_ = m.as<FinishMsg>();
    enter(RoundEvent::Finish);
  }
}

void Group::on_stop(const StopMsg& s) {
  if (s.restart_count != round_ || !enter(RoundEvent::Failure)) return;
  info("the coordinator stops every node: " + first_line(s.cause.text) +
       (s.cause.kind == "worker" ? " on node " + std::to_string(s.cause.node_rank) + " (" + s.cause.host + ")" : ""));
}

void Group::on_start(const StartMsg& st) {
  if (st.cause.kind == "membership") {
    info(first_line(st.cause.text) + "; the coordinator starts round " + std::to_string(st.restart_count) + " with " +
         std::to_string(assign_.nnodes) + " nodes");
  } else {
    failed_attempts_.push_back(attempt_failed_text(round_, st.cause));
    info("attempt " + std::to_string(round_) + " failed (" + first_line(st.cause.text) +
         (st.cause.kind == "worker" ? " on node " + std::to_string(st.cause.node_rank) + " (" + st.cause.host + ")" : "") +
         (st.cause.kind == "node-lost" && elastic()
              ? "); the coordinator restarts the workers of the " + std::to_string(assign_.nnodes) + " remaining nodes"
              : std::string("); the coordinator restarts every node's workers")));
  }
  restarts_used_ = st.restarts_used;
  round_ = st.restart_count;
  if (!enter(RoundEvent::Start)) return;
  local_done_ = false;
  start_ = round_;
}

void Group::lost(Node& n, const std::string& why) {
  if (!n.link) return;
  const std::string peer = n.link->peer();
  drop_link(n);
  if (finish_) return;  // the job is over; the peer may simply have exited
  Cause c;
  c.kind = "node-lost";
  c.restart_count = round_;
  c.node_rank = n.node_rank;
  c.host = n.host;
  c.exit_code = exit_codes::kNodeLost;
  c.time_us = now_us();
  c.text = "lspawn: root cause: node " + std::to_string(n.node_rank) + " (" + n.host + ", " + n.addr +
           ") was lost: " + why + "\n";
  info("lost " + peer + ": " + why);
  if (coordinator_) {
    coordinator_failure(c);
    n.done = true;
    maybe_decide();
    return;
  }
  lost_coordinator_ = c;
  enter(RoundEvent::Failure);
  if (local_done_) {
    finish_ = failed_finish(c, round_);
    enter(RoundEvent::Finish);
  }
}

void Group::send_hang_message(int node_rank, const std::string& type, const Body& body) {
  for (auto& n : nodes_) {
    if (n->node_rank != node_rank || !n->link) continue;
    try {
      n->link->send(type, body);
      flush_soon_ = flush_soon_ || n->link->pending();
    } catch (const LinkError& e) {
      lost(*n, e.what());
    }
    return;
  }
}

void Group::broadcast(const std::string& type, const Body& body) {
  for (auto& n : nodes_) {
    if (!n->link) continue;
    try {
      n->link->send(type, body);
      flush_soon_ = flush_soon_ || n->link->pending();
    } catch (const LinkError& e) {
      lost(*n, e.what());
    }
  }
}

void Group::coordinator_failure(const Cause& c) {
  causes_.push_back(c);
  if (!enter(RoundEvent::Failure)) return;  // stopping already: the cause is recorded
  if (opts_.nnodes > 1) {
    info("stopping the workers of every node: " + first_line(c.text) +
         (c.kind == "worker" ? " on node " + std::to_string(c.node_rank) + " (" + c.host + ")" : ""));
  }
  StopMsg s;
  s.restart_count = round_;
  s.cause = c;
  broadcast("stop", body_of(s));
}

void Group::local_failure(const Cause& c) {
  if (finish_) return;
  if (coordinator_) {
    coordinator_failure(c);
    return;
  }
  broadcast("failed", body_of(FailedMsg{c}));
}

void Group::local_done(bool failed, const Cause& c) {
  local_done_ = true;
  if (coordinator_) {
    node_done(assign_.node_rank, failed, c);
    return;
  }
  if (lost_coordinator_) {
    finish_ = failed_finish(*lost_coordinator_, round_);
    enter(RoundEvent::Finish);
    return;
  }
  DoneMsg d;
  d.restart_count = round_;
  d.failed = failed;
  d.cause = c;
  broadcast("done", body_of(d));
}

void Group::node_done(int node_rank, bool failed, const Cause& c) {
  if (failed) causes_.push_back(c);
  for (auto& n : nodes_)
    if (n->node_rank == node_rank) n->done = true;
  maybe_decide();
}

// Every node done: the round's decision (round.hpp), once.
void Group::maybe_decide() {
  if (state_ == RoundState::Restarting || state_ == RoundState::Finished || !local_done_) return;
  for (auto& n : nodes_)
    if (!n->done) return;
  RoundFacts facts;
  facts.round = round_;
  facts.causes = causes_;
  facts.restarts_used = restarts_used_;
  facts.max_restarts = opts_.max_restarts;
  facts.no_restart_codes = opts_.no_restart_exit_codes;
  facts.elastic = elastic();
  facts.min_nnodes = opts_.min_nnodes;
  facts.nnodes_flag = nnodes_text();
  facts.next_nodes = nodes_alive() + waiting_joiners();
  facts.any_lost = nodes_alive() - 1 < static_cast<int>(nodes_.size());
  const RoundDecision d = decide_round(facts);
  if (d.finish) {
    finish_with(*d.finish);
    return;
  }
  if (d.counted) {
    failed_attempts_.push_back(attempt_failed_text(round_, *d.restart));
    say_restart(d);
  }
  restart_ = Restart{*d.restart, d.counted};
  enter(RoundEvent::Restart);
}

void Group::say_restart(const RoundDecision& d) const {
  const int next_nodes = nodes_alive() + waiting_joiners();
  info("attempt " + std::to_string(round_) + " failed; restarting " +
       (d.survivors ? "the " + std::to_string(next_nodes) + (next_nodes == 1 ? " remaining node's" : " remaining nodes'") +
                          " workers (--nnodes " + nnodes_text() + ", "
                    : std::string("every node's workers (")) +
       "restart " + std::to_string(restarts_used_ + 1) + " of at most " + std::to_string(opts_.max_restarts) + ")");
  if (!opts_.info) return;
  std::istringstream lines(d.restart->text);
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("lspawn: ", 0) == 0) l = l.substr(8);
    info("  attempt " + std::to_string(round_) + ": " + l);
  }
}

void Group::finish_with(const FinishMsg& f) {
  finish_ = f;
  enter(RoundEvent::Finish);
  broadcast("finish", body_of(f));
  for (auto& j : joiners_) {
    if (!j->join) continue;
    try {
      j->link->send("reject", RejectMsg{"rendezvous on " + endpoint_ + ": the job ended (exit code " +
                                        std::to_string(f.exit_code) + ") before this node could join"});
    } catch (const LinkError&) {
    }
  }
}

// The coordinator begins the round maybe_decide() decided. An elastic job first drops its lost
// nodes, admits the waiting ones and numbers them all again (each is sent its AssignMsg).
void Group::begin_round() {
  const Restart r = restart_;
  if (auto lost = lost_since_decision(causes_, elastic(), nodes_alive() + waiting_joiners(), opts_.min_nnodes)) {
    finish_with(failed_finish(*lost, round_));
    return;
  }
  ++round_;
  if (r.counted) ++restarts_used_;
  causes_.clear();
  local_done_ = false;
  enter(RoundEvent::Start);
  const std::vector<Node*> fresh = elastic() ? renumber_elastic() : std::vector<Node*>{};
  assign_.restart_count = round_;
  assign_.restarts_used = restarts_used_;
  for (auto& n : nodes_) n->done = !n->link;
  send_round(r.cause, fresh);
  start_ = round_;
}

// Elastic: the lost nodes go, the waiting ones come in, and every node gets its place
// (membership.hpp's elastic_node_ranks). Returns the admitted nodes.
std::vector<Group::Node*> Group::renumber_elastic() {
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return !n->link; }), nodes_.end());
  std::vector<int> old_ranks;
  for (auto& n : nodes_) old_ranks.push_back(n->node_rank);
  std::vector<Node*> fresh;  // admitted now: they get their assignment, no "start"
  for (size_t i = 0; i < joiners_.size(); ++i) {
    if (!joiners_[i]->join) continue;
    auto n = std::make_unique<Node>();
    n->host = joiners_[i]->join->host;
    n->addr = sys::peer_ip(joiners_[i]->link->fd());
    n->link = std::move(joiners_[i]->link);
    by_fd_[n->link->fd()] = n.get();  // watched since its accept
    fresh.push_back(n.get());
    nodes_.push_back(std::move(n));
    joiners_.erase(joiners_.begin() + static_cast<long>(i));
    --i;
  }
  const std::vector<int> rank = elastic_node_ranks(old_ranks, static_cast<int>(fresh.size()));
  for (size_t i = 0; i < nodes_.size(); ++i) nodes_[i]->node_rank = rank[i];
  std::stable_sort(nodes_.begin(), nodes_.end(), [](const auto& a, const auto& b) { return a->node_rank < b->node_rank; });
  assign_.nnodes = static_cast<int>(nodes_.size()) + 1;
  assign_.node_rank = 0;
  assign_.coordinator = 0;
  assign_.hosts = {opts_.host};
  for (auto& n : nodes_) {
    n->link->set_peer("node " + std::to_string(n->node_rank) + " (" + n->host + ", " + n->addr + ")");
    assign_.hosts.push_back(n->host);
  }
  return fresh;
}

// The new round to every node: elastic, each its place first; then "start" to all but the
// admitted ones (their assignment starts them).
void Group::send_round(const Cause& cause, const std::vector<Node*>& fresh) {
  if (elastic()) {
    const AssignBodies bodies(assign_);
    for (auto& n : nodes_) {
      try {
        n->link->send("assign", bodies.for_node(n->node_rank));
      } catch (const LinkError&) {
        // Noticed below (the next send) or by tick().
      }
    }
  }
  flush_soon_ = true;  // the assignments name every host: a socket may not take one at once
  StartMsg st;
  st.restart_count = round_;
  st.restarts_used = restarts_used_;
  st.cause = cause;
  for (auto& n : nodes_) {
    if (!n->link || std::find(fresh.begin(), fresh.end(), n.get()) != fresh.end()) continue;
    try {
      n->link->send("start", st);
    } catch (const LinkError& e) {
      lost(*n, e.what());
    }
  }
  for (Node* n : fresh) n->link->touch();
}

std::optional<int> Group::take_start() {
  if (state_ == RoundState::Restarting) begin_round();
  auto s = start_;
  start_.reset();
  return s;
}

// The channel's housekeeping over every node, once per sweep: kSweepsPerHeartbeat sweeps per
// heartbeat interval, and one 10 ms after a write the socket did not take whole. Between sweeps
// tick() and next_wakeup() cost nothing, so a coordinator woken by thousands of nodes' messages
// does not walk every node on each wake-up. A node's silence is therefore noticed up to a
// quarter of the heartbeat interval after --node-timeout (at most 250 ms).
void Group::tick() {
  const auto now = Clock::now();
  if (now < next_sweep_ && !(flush_soon_ && now >= flush_at_)) return;
  for (size_t i = 0; i < joiners_.size(); ++i) {
    if (joiners_[i]->join || now <= join_due(joiners_[i]->accepted_at, opts_.node_timeout)) continue;
    info(join_overdue(endpoint_, joiners_[i]->endpoint, opts_.node_timeout));
    drop_joiner(i);
    --i;
  }
  bool pending = false;
  for (auto& n : nodes_) {
    if (!n->link) continue;
    if (now - n->link->last_in() > opts_.node_timeout && now >= n->busy_until) {
      lost(*n, "nothing received for " + seconds_text(opts_.node_timeout) + " (--node-timeout)");
      continue;
    }
    try {
      if (now - n->link->last_out() >= heartbeat_interval()) {
        n->link->send("hb", Heartbeat{});
      } else if (n->link->pending()) {
        n->link->flush();
      }
      pending = pending || n->link->pending();
    } catch (const LinkError& e) {
      lost(*n, e.what());
    }
  }
  flush_soon_ = pending;
  flush_at_ = now + kFlushRetry;
  next_sweep_ = now + heartbeat_interval() / kSweepsPerHeartbeat;
}

Clock::time_point Group::next_wakeup() const {
  if (nodes_.empty() && joiners_.empty()) return Clock::time_point::max();
  return flush_soon_ ? std::min(next_sweep_, flush_at_) : next_sweep_;
}

bool Group::wait(Clock::time_point deadline, int extra_fd) {
  std::vector<pollfd> pfds{{poller_.fd(), POLLIN, 0}};
  if (extra_fd >= 0) pfds.push_back({extra_fd, POLLIN, 0});
  poll_fds(pfds, std::min(deadline, next_wakeup()));
  if (pfds[0].revents) on_readable();
  tick();
  return extra_fd >= 0 && pfds[1].revents;
}

void Group::announce_busy(milliseconds limit) {
  BusyMsg b;
  b.ms = limit.count();
  broadcast("busy", body_of(b));
}

void Group::flush_for(milliseconds limit) {
  const auto end = Clock::now() + limit;
  for (;;) {
    bool pending = false;
    for (auto& n : nodes_) {
      if (!n->link || !n->link->pending()) continue;
      try {
        n->link->flush();
      } catch (const LinkError&) {
        drop_link(*n);
        continue;
      }
      pending = pending || n->link->pending();
    }
    if (!pending || Clock::now() >= end) return;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

}  // namespace lspawn::node
