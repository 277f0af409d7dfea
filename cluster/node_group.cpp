#include "cluster/node_group.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

#include <poll.h>

#include "sys/duration_text.hpp"
#include "sys/exit_codes.hpp"

namespace lspawn::node {

namespace {

using std::chrono::milliseconds;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
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

}  // namespace

// ---- Forming ---------------------------------------------------------------------------------

std::unique_ptr<NodeGroup> NodeGroup::form(const NodeGroupOptions& o, int solo_master_port) {
  FormedJob job = rendezvous(o, solo_master_port);
  const std::string formed_line = job.formed_line;
  std::unique_ptr<NodeGroup> g(new NodeGroup(o, std::move(job)));
  if (!formed_line.empty()) g->info(formed_line);
  return g;
}

NodeGroup::NodeGroup(const NodeGroupOptions& o, FormedJob job)
    : opts_(o),
      coordinator_(job.coordinator),
      assign_(std::move(job.assign)),
      master_port_(std::move(job.master_port)),
      links_(std::move(job.links)),
      admission_(opts_, *links_) {
  round_ = assign_.restart_count;  // a node admitted to a running elastic job: its round
  restarts_used_ = assign_.restarts_used;
  if (job.listener) {
    admission_.open(std::move(job.listener), job.listener_watched, std::move(job.endpoint), std::move(job.unjoined));
  }
  for (auto& [n, why] : job.broken) lost(*n, "its connection broke during the rendezvous (" + why + ")");
  if (!job.queued.empty()) {
    NodeLink& coordinator = *links_->nodes().front();
    for (auto& m : job.queued) handle(coordinator, m);
  }
}

NodeGroup::~NodeGroup() = default;

void NodeGroup::info(const std::string& line) const {
  if (opts_.info) opts_.info(line);
}

milliseconds NodeGroup::heartbeat_interval() const {
  return node::heartbeat_interval(assign_.nnodes, opts_.node_timeout);
}

milliseconds NodeGroup::status_interval() const { return node::status_interval(assign_.nnodes); }

bool NodeGroup::enter(RoundEvent e) {
  const std::optional<RoundState> next = next_round_state(state_, e);
  if (!next) return false;
  state_ = *next;
  return true;
}

bool NodeGroup::elastic() const { return is_elastic(opts_.min_nnodes, opts_.nnodes); }

std::string NodeGroup::nnodes_text() const { return nnodes_flag(opts_.min_nnodes, opts_.nnodes); }

Links::Lost NodeGroup::lost_fn() {
  return [this](NodeLink& n, const std::string& why) { lost(n, why); };
}

void NodeGroup::broadcast(const std::string& type, const Body& body) { links_->broadcast(type, body, lost_fn()); }

// ---- The channel -----------------------------------------------------------------------------

void NodeGroup::on_readable() {
  for (int fd : links_->poller().ready(milliseconds(0), kReadyPerCall)) {
    if (NodeLink* n = links_->by_fd(fd)) {
      read_node(*n);
      continue;
    }
    if (auto admitted = admission_.on_ready(fd, [this] { return round_view(); })) on_admitted(*admitted);
  }
}

void NodeGroup::read_node(NodeLink& n) {
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

void NodeGroup::handle(NodeLink& n, const Message& m) {
  n.busy_until =
      m.type == "busy" ? Clock::now() + milliseconds(std::max<int64_t>(m.as<BusyMsg>().ms, 0)) : Clock::time_point{};
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

void NodeGroup::handle_member_message(const Message& m) {
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

void NodeGroup::on_stop(const StopMsg& s) {
  if (s.restart_count != round_ || !enter(RoundEvent::Failure)) return;
  info("the coordinator stops every node: " + first_line(s.cause.text) +
       (s.cause.kind == CauseKind::Worker ? " on node " + std::to_string(s.cause.node_rank) + " (" + s.cause.host + ")"
                                          : ""));
}

void NodeGroup::on_start(const StartMsg& st) {
  if (st.cause.kind == CauseKind::Membership) {
    info(first_line(st.cause.text) + "; the coordinator starts round " + std::to_string(st.restart_count) + " with " +
         std::to_string(assign_.nnodes) + " nodes");
  } else {
    failed_attempts_.push_back(attempt_failed_text(round_, st.cause));
    info("attempt " + std::to_string(round_) + " failed (" + first_line(st.cause.text) +
         (st.cause.kind == CauseKind::Worker
              ? " on node " + std::to_string(st.cause.node_rank) + " (" + st.cause.host + ")"
              : "") +
         (st.cause.kind == CauseKind::NodeLost && elastic()
              ? "); the coordinator restarts the workers of the " + std::to_string(assign_.nnodes) + " remaining nodes"
              : std::string("); the coordinator restarts every node's workers")));
  }
  restarts_used_ = st.restarts_used;
  round_ = st.restart_count;
  if (st.master_port > 0) assign_.master_port = st.master_port;  // this round's store port
  if (!enter(RoundEvent::Start)) return;
  local_done_ = false;
  start_ = round_;
}

// Said before the link is closed: the peer (or whoever watches it) that sees the close finds the
// reason already written.
void NodeGroup::lost(NodeLink& n, const std::string& why) {
  if (!n.link) return;
  if (finish_) {  // the job is over; the peer may simply have exited
    links_->drop(n);
    return;
  }
  info("lost " + n.link->peer() + ": " + why);
  links_->drop(n);
  Cause c;
  c.kind = CauseKind::NodeLost;
  c.restart_count = round_;
  c.node_rank = n.node_rank;
  c.host = n.host;
  c.exit_code = exit_codes::kNodeLost;
  c.time_us = now_us();
  c.text = "lspawn: root cause: node " + std::to_string(n.node_rank) + " (" + n.host + ", " + n.addr +
           ") was lost: " + why + "\n";
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

void NodeGroup::send_hang_message(int node_rank, const std::string& type, const Body& body) {
  links_->send_to(node_rank, type, body, lost_fn());
}

// ---- Elastic admission -----------------------------------------------------------------------

Admission::RoundView NodeGroup::round_view() const {
  Admission::RoundView v;
  v.ended = finish_.has_value();
  v.nodes_alive = links_->alive();
  bool some_done = local_done_;
  for (auto& n : links_->nodes()) some_done = some_done || (n->link && n->done);
  v.every_node_running = state_ == RoundState::Running && !some_done;
  return v;
}

// A node joined while every node's workers ran: the round stops, the next one admits it.
void NodeGroup::on_admitted(const Admission::Admitted& a) {
  Cause c;
  c.kind = CauseKind::Membership;
  c.restart_count = round_;
  c.host = a.host;
  c.exit_code = 0;
  c.time_us = now_us();
  c.text = "lspawn: root cause: a new node, " + a.peer + ", joined the job (--nnodes " + nnodes_text() +
           "): the next round admits it\n";
  coordinator_failure(c);
}

// ---- This node's side of the round -----------------------------------------------------------

void NodeGroup::coordinator_failure(const Cause& c) {
  causes_.push_back(c);
  if (!enter(RoundEvent::Failure)) return;  // stopping already: the cause is recorded
  if (opts_.nnodes > 1) {
    info("stopping the workers of every node: " + first_line(c.text) +
         (c.kind == CauseKind::Worker ? " on node " + std::to_string(c.node_rank) + " (" + c.host + ")" : ""));
  }
  StopMsg s;
  s.restart_count = round_;
  s.cause = c;
  broadcast("stop", body_of(s));
}

bool NodeGroup::local_failure(const Cause& c) {
  if (local_.failure_sent) return false;
  local_.failure_sent = true;
  if (finish_) return true;
  if (coordinator_) {
    coordinator_failure(c);
    return true;
  }
  broadcast("failed", body_of(FailedMsg{c}));
  return true;
}

bool NodeGroup::local_done(bool failed, const Cause& c) {
  if (local_.done_sent) return false;
  local_.done_sent = true;
  local_done_ = true;
  if (coordinator_) {
    node_done(assign_.node_rank, failed, c);
    return true;
  }
  if (lost_coordinator_) {
    finish_ = failed_finish(*lost_coordinator_, round_);
    enter(RoundEvent::Finish);
    return true;
  }
  DoneMsg d;
  d.restart_count = round_;
  d.failed = failed;
  d.cause = c;
  broadcast("done", body_of(d));
  return true;
}

// ---- The round's decision and the next round -------------------------------------------------

void NodeGroup::node_done(int node_rank, bool failed, const Cause& c) {
  if (failed) causes_.push_back(c);
  for (auto& n : links_->nodes())
    if (n->node_rank == node_rank) n->done = true;
  maybe_decide();
}

// Every node done: the round's decision (round.hpp), once.
void NodeGroup::maybe_decide() {
  if (state_ == RoundState::Restarting || state_ == RoundState::Finished || !local_done_) return;
  for (auto& n : links_->nodes())
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
  facts.next_nodes = links_->alive() + admission_.waiting();
  facts.any_lost = links_->alive() - 1 < static_cast<int>(links_->nodes().size());
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

void NodeGroup::say_restart(const RoundDecision& d) const {
  const int next_nodes = links_->alive() + admission_.waiting();
  info("attempt " + std::to_string(round_) + " failed; restarting " +
       (d.survivors
            ? "the " + std::to_string(next_nodes) + (next_nodes == 1 ? " remaining node's" : " remaining nodes'") +
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

void NodeGroup::finish_with(const FinishMsg& f) {
  finish_ = f;
  enter(RoundEvent::Finish);
  broadcast("finish", body_of(f));
  admission_.job_ended(f.exit_code);
}

// The coordinator begins the round maybe_decide() decided. An elastic job first drops its lost
// nodes, admits the waiting ones and numbers them all again (each is sent its AssignMsg).
void NodeGroup::begin_round() {
  const Restart r = restart_;
  if (auto lost = lost_since_decision(causes_, elastic(), links_->alive() + admission_.waiting(), opts_.min_nnodes)) {
    finish_with(failed_finish(*lost, round_));
    return;
  }
  ++round_;
  if (r.counted) ++restarts_used_;
  causes_.clear();
  local_done_ = false;
  enter(RoundEvent::Start);
  const std::vector<NodeLink*> fresh = elastic() ? admission_.admit_waiting(assign_) : std::vector<NodeLink*>{};
  assign_.restart_count = round_;
  assign_.restarts_used = restarts_used_;
  fence_master_port();
  for (auto& n : links_->nodes()) n->done = !n->link;
  send_round(r.cause, fresh);
  start_ = round_;
}

// A new round's workers get a store port of their own (docs/security.md, "Rounds"): node 0, when
// it is this coordinator, reserves a fresh one and keeps the previous round's reserved, never
// listening, so that a worker of that round that wakes up late is refused at once (ECONNREFUSED)
// instead of reaching the new round's store. Only the previous one (kHeldEarlierPorts): holding
// every round's would cost a socket per round for the job's life (the soak's 100 elastic rounds);
// a worker of an older round finds its port released, and the round key fences it. A one-node
// job keeps its port (the user's --master-port; its old workers are gone before the next round
// starts), and so does a job whose node 0 is a member (the round key fences it).
void NodeGroup::fence_master_port() {
  if (opts_.nnodes <= 1 || !master_port_) return;
  try {
    PortReservation next(assign_.master_addr, 0);
    earlier_ports_.push_back(std::move(*master_port_));
    while (earlier_ports_.size() > kHeldEarlierPorts) earlier_ports_.pop_front();
    master_port_.emplace(std::move(next));
    assign_.master_port = master_port_->port();
  } catch (const PortError& e) {
    info("round " + std::to_string(round_) + ": no new port for the workers' store on " + assign_.master_addr + " (" +
         e.what() + "); its workers keep port " + std::to_string(assign_.master_port));
  }
}

// The new round to every node: elastic, each its place first; then "start" to all but the
// admitted ones (their assignment starts them).
void NodeGroup::send_round(const Cause& cause, const std::vector<NodeLink*>& fresh) {
  if (elastic()) {
    const AssignBodies bodies(assign_);
    for (auto& n : links_->nodes()) {
      try {
        n->link->send("assign", bodies.for_node(n->node_rank));
      } catch (const LinkError&) {
        // Noticed below (the next send) or by tick().
      }
    }
  }
  links_->flush_soon();  // the assignments name every host: a socket may not take one at once
  StartMsg st;
  st.restart_count = round_;
  st.restarts_used = restarts_used_;
  st.cause = cause;
  st.master_port = master_port_ ? assign_.master_port : 0;
  const Body start = body_of(st);
  for (auto& n : links_->nodes()) {
    if (!n->link || std::find(fresh.begin(), fresh.end(), n.get()) != fresh.end()) continue;
    links_->send(*n, "start", start, lost_fn());
  }
  for (NodeLink* n : fresh) n->link->touch();
}

std::optional<int> NodeGroup::take_start() {
  if (state_ == RoundState::Restarting) begin_round();
  auto s = start_;
  start_.reset();
  if (s) local_ = LocalRound{};
  return s;
}

// ---- Upkeep (links.hpp) ----------------------------------------------------------------------

void NodeGroup::tick() {
  const auto now = Clock::now();
  if (!links_->sweep_due(now)) return;
  admission_.drop_overdue(now);
  links_->sweep(now, heartbeat_interval(), opts_.node_timeout,
                "nothing received for " + seconds_text(opts_.node_timeout) + " (--node-timeout)", lost_fn());
}

Clock::time_point NodeGroup::next_wakeup() const {
  if (links_->nodes().empty() && !admission_.any()) return Clock::time_point::max();
  return links_->next_sweep();
}

bool NodeGroup::wait(Clock::time_point deadline, int extra_fd) {
  std::vector<pollfd> pfds{{links_->fd(), POLLIN, 0}};
  if (extra_fd >= 0) pfds.push_back({extra_fd, POLLIN, 0});
  poll_fds(pfds, std::min(deadline, next_wakeup()));
  if (pfds[0].revents) on_readable();
  tick();
  return extra_fd >= 0 && pfds[1].revents;
}

void NodeGroup::announce_busy(milliseconds limit) {
  BusyMsg b;
  b.ms = limit.count();
  broadcast("busy", body_of(b));
}

void NodeGroup::flush_for(milliseconds limit) { links_->flush_for(limit); }

}  // namespace lspawn::node
