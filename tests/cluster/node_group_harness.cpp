#include "cluster/node_group_harness.hpp"

#include <fcntl.h>

#include <algorithm>
#include <exception>

#include "sys/epoll.hpp"
#include "sys/exit_codes.hpp"

namespace lspawn::test {

namespace {

using std::chrono::milliseconds;
using Clock = node::Clock;

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool NodeView::stopped_in(int r) const {
  return std::find(rounds_stopped.begin(), rounds_stopped.end(), r) != rounds_stopped.end();
}

bool NodeView::has_info(const std::string& part) const {
  return std::any_of(info.begin(), info.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; });
}

// The fake workers of one round, as the supervisor would report them (run.cpp's per-round
// flags: failure_sent, done_sent).
struct HarnessNode::Round {
  bool running = true;                 // some worker of this node runs
  std::optional<node::Cause> failure;  // this node's failure, for local_failure()
  bool failure_sent = false;
  bool done_sent = false;
  bool stop_seen = false;
  bool hold_on_stop = false;  // kept across rounds
};

HarnessNode::HarnessNode(TestedGroupOptions opts)
    : opts_(std::move(opts)), host_(opts_.host), wake_(sys::make_pipe("harness wake-up", O_NONBLOCK)) {
  opts_.info = [this, also = std::move(opts_.info)](const std::string& line) {
    if (also) also(line);  // the test's own, on the node's thread, as the line is said
    {
      std::lock_guard<std::mutex> lk(mu_);
      view_.info.push_back(line);
    }
    changed_.notify_all();
  };
  opts_.on_hang_message = [this](int from, const node::Message& m) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      view_.hang_messages.emplace_back(from, m.type);
    }
    changed_.notify_all();
  };
  thread_ = std::thread([this] { main(); });
}

HarnessNode::~HarnessNode() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    quit_ = true;
  }
  changed_.notify_all();
  sys::write_all(wake_.write.get(), "q", "harness wake-up");
  thread_.join();
}

NodeView HarnessNode::view() const {
  std::lock_guard<std::mutex> lk(mu_);
  return view_;
}

bool HarnessNode::await(const std::function<bool(const NodeView&)>& pred, milliseconds limit) const {
  std::unique_lock<std::mutex> lk(mu_);
  changed_.wait_for(lk, limit, [&] { return pred(view_); });
  return pred(view_);
}

void HarnessNode::post(Command cmd) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    commands_.push_back(std::move(cmd));
  }
  sys::write_all(wake_.write.get(), "c", "harness wake-up");
}

void HarnessNode::fail(int local_rank, int exit_code, int64_t time_us) {
  const int64_t when = time_us ? time_us : now_us();
  post([this, local_rank, exit_code, when](TestedGroup& g, Round& r) {
    if (r.done_sent) return;  // this node's round is over
    node::Cause c;
    c.kind = node::CauseKind::Worker;
    c.restart_count = g.round();
    c.node_rank = g.assignment().node_rank;
    c.rank = c.node_rank * opts_.nproc_per_node + local_rank;
    c.host = host_;
    c.exit_code = exit_code;
    c.time_us = when;
    c.text = "lspawn: root cause: process " + std::to_string(c.rank) + " terminated with exit code " +
             std::to_string(exit_code) + "\n";
    if (!r.failure) r.failure = c;
    r.running = false;
  });
}

void HarnessNode::hang() {
  post([this](TestedGroup& g, Round& r) {
    if (r.done_sent) return;
    node::Cause c;
    c.kind = node::CauseKind::Hang;
    c.restart_count = g.round();
    c.node_rank = g.assignment().node_rank;
    c.host = host_;
    c.exit_code = exit_codes::kHang;
    c.time_us = now_us();
    c.text = "lspawn: root cause: no rank made progress in its collectives on node " + std::to_string(c.node_rank) +
             " (" + host_ + "): stopped by the hang watchdog (--hang-timeout)\n";
    if (!r.failure) r.failure = c;
    r.running = false;
  });
}

void HarnessNode::succeed() {
  post([](TestedGroup&, Round& r) { r.running = false; });
}

void HarnessNode::hold_workers_on_stop() {
  post([](TestedGroup&, Round& r) { r.hold_on_stop = true; });
}

void HarnessNode::send_hang_message(int to, const std::string& type) {
  post([to, type](TestedGroup& g, Round&) {
    node::Body body;
    if (type == "status") {
      node::StatusMsg m;
      m.restart_count = g.round();
      body = node::body_of(m);
    } else if (type == "stacks?") {
      node::StackAskMsg m;
      m.restart_count = g.round();
      body = node::body_of(m);
    } else {
      node::StacksMsg m;
      m.restart_count = g.round();
      body = node::body_of(m);
    }
    g.send_hang_message(to, type, body);
  });
}

void HarnessNode::die() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    die_ = true;
  }
  changed_.notify_all();
  sys::write_all(wake_.write.get(), "d", "harness wake-up");
}

void HarnessNode::go_silent() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    silent_ = true;
  }
  sys::write_all(wake_.write.get(), "s", "harness wake-up");
}

void HarnessNode::publish(const TestedGroup* g, const std::function<void(NodeView&)>& also) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (g) {
      view_.coordinator = g->coordinator();
      view_.assignment = g->assignment();
      view_.round = g->round();
      view_.restarts_used = g->restarts_used();
      view_.failed_attempts = g->failed_attempts();
      view_.finish = g->finish();
    }
    if (also) also(view_);
  }
  changed_.notify_all();
}

void HarnessNode::main() {
  std::unique_ptr<TestedGroup> g;
  try {
    g = TestedGroup::form(opts_);
  } catch (const TestedRendezvousError& e) {
    publish(nullptr, [&](NodeView& v) {
      v.rendezvous_error = e.what();
      v.ended = true;
    });
    return;
  } catch (const std::exception& e) {
    publish(nullptr, [&](NodeView& v) {
      v.other_error = e.what();
      v.ended = true;
    });
    return;
  }
  publish(g.get(), [](NodeView& v) { v.formed = true; });
  try {
    drive(*g);
  } catch (const std::exception& e) {
    publish(g.get(), [&](NodeView& v) { v.other_error = e.what(); });
  }
  g.reset();  // this lspawn exits (or died): its sockets close
  publish(nullptr, [](NodeView& v) { v.ended = true; });
}

// run.cpp's drive_round() with fake workers, round after round, until the job finishes or the
// test stops this node.
void HarnessNode::drive(TestedGroup& g) {
  Round r;
  // While the workers run, run.cpp's supervisor loop watches the group's fd among its own; here
  // the group's fd and the wake-up pipe.
  sys::Epoll events("harness node " + host_);
  events.add(g.fd());
  events.add(wake_.read.get());
  for (;;) {
    std::deque<Command> cmds;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (silent_) {
        changed_.wait(lk, [&] { return quit_ || die_; });  // the group is not touched any more
      }
      if (quit_ || die_) return;
      cmds.swap(commands_);
    }
    for (auto& c : cmds) c(g, r);

    // run.cpp's report_local_events().
    if (r.failure && !r.failure_sent) {
      g.local_failure(*r.failure);
      r.failure_sent = true;
    }
    if (g.stop_requested() && !r.stop_seen) {
      r.stop_seen = true;
      publish(&g, [&](NodeView& v) { v.rounds_stopped.push_back(g.round()); });
    }
    if (g.stop_requested() && r.running && !r.hold_on_stop) r.running = false;  // stopped, not failed
    if (!r.running && !r.done_sent) {
      r.done_sent = true;
      const int round = g.round();
      g.local_done(r.failure.has_value(), r.failure ? *r.failure : node::Cause{});
      publish(&g, [&](NodeView& v) { v.rounds_done.push_back(round); });
    }

    const std::optional<int> next = g.take_start();
    if (next) publish(&g, [&](NodeView& v) { v.rounds_started.push_back(*next); });
    if (g.finish()) {
      publish(&g);
      g.flush_for(milliseconds(1000));  // run.cpp's print_outcome(), then lspawn exits
      return;
    }
    if (next) {
      const bool hold = r.hold_on_stop;
      r = Round{};  // the workers of the new round run
      r.hold_on_stop = hold;
      continue;
    }
    publish(&g);

    // Wait for the channel (or a command) until the group's next wake-up, then its housekeeping.
    bool woken = false;
    if (r.running) {
      const auto due = g.next_wakeup();
      const auto now = Clock::now();
      const milliseconds timeout =
          due <= now ? milliseconds(0) : std::min(std::chrono::ceil<milliseconds>(due - now), milliseconds(60000));
      for (int fd : events.ready(timeout)) {
        if (fd == g.fd()) g.on_readable();
        if (fd == wake_.read.get()) woken = true;
      }
    } else {
      woken = g.wait(Clock::time_point::max(), wake_.read.get());  // as run.cpp with its signal fd
    }
    if (woken) {
      char buf[64];
      while (sys::read_some(wake_.read.get(), buf, sizeof buf, "harness wake-up") > 0) {}
    }
    g.tick();
  }
}

LoopbackJob::LoopbackJob() : port_("127.0.0.1", 0) {}

TestedGroupOptions LoopbackJob::static_options(int nnodes, int node_rank) const {
  TestedGroupOptions o;
  o.endpoint_addr = "127.0.0.1";
  o.endpoint_port = port();
  o.static_mode = true;
  o.nnodes = nnodes;
  o.node_rank = node_rank;
  o.nproc_per_node = 1;
  o.node_timeout = milliseconds(3000);
  o.rdzv_timeout = milliseconds(10000);
  o.host = "node" + std::to_string(node_rank);
  return o;
}

TestedGroupOptions LoopbackJob::rdzv_options(int nnodes, int min_nnodes, const std::string& host) const {
  TestedGroupOptions o;
  o.endpoint_addr = "127.0.0.1";
  o.endpoint_port = port();
  o.static_mode = false;
  o.nnodes = nnodes;
  o.min_nnodes = min_nnodes;
  o.last_call = milliseconds(300);
  o.node_rank = -1;
  o.nproc_per_node = 1;
  o.node_timeout = milliseconds(3000);
  o.rdzv_timeout = milliseconds(10000);
  o.host = host;
  return o;
}

HarnessNode& LoopbackJob::add(TestedGroupOptions opts) {
  nodes_.push_back(std::make_unique<HarnessNode>(std::move(opts)));
  return *nodes_.back();
}

bool LoopbackJob::await_all(const std::function<bool(const NodeView&)>& pred, milliseconds limit) const {
  const auto end = Clock::now() + limit;
  bool all = true;
  for (auto& n : nodes_) {
    const auto left = std::max(std::chrono::ceil<milliseconds>(end - Clock::now()), milliseconds(0));
    all = n->await(pred, left) && all;
  }
  return all;
}

}  // namespace lspawn::test
