#include "cluster/links.hpp"

#include <algorithm>
#include <thread>

#include <poll.h>

namespace lspawn::node {

using std::chrono::milliseconds;

milliseconds heartbeat_interval(int nnodes, milliseconds node_timeout) {
  const milliseconds budget = std::max(milliseconds(1000), milliseconds(nnodes));
  return std::max(std::min(budget, node_timeout / 4), milliseconds(20));
}

milliseconds status_interval(int nnodes) { return std::max(milliseconds(250), milliseconds(nnodes)); }

int poll_fds(std::vector<pollfd>& pfds, Clock::time_point deadline) {
  const auto now = Clock::now();
  int timeout = 0;
  if (deadline > now) {
    timeout =
        static_cast<int>(std::min<long long>(std::chrono::ceil<milliseconds>(deadline - now).count(), 86400000LL));
  }
  int n = ::poll(pfds.data(), pfds.size(), timeout);
  if (n < 0 && errno != EINTR) sys::throw_errno("poll", "control channel");
  return n < 0 ? 0 : n;
}

NodeLink& Links::add(std::unique_ptr<NodeLink> n, bool add_to_poller) {
  if (add_to_poller) poller_.add(n->link->fd());
  by_fd_[n->link->fd()] = n.get();
  nodes_.push_back(std::move(n));
  return *nodes_.back();
}

NodeLink* Links::by_fd(int fd) {
  auto it = by_fd_.find(fd);
  return it == by_fd_.end() ? nullptr : it->second;
}

void Links::drop(NodeLink& n) {
  if (!n.link) return;
  poller_.remove(n.link->fd());
  by_fd_.erase(n.link->fd());
  n.link.reset();
}

void Links::erase_lost() {
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return !n->link; }), nodes_.end());
}

int Links::alive() const {
  int n = 1;  // this node
  for (auto& node : nodes_) n += node->link != nullptr;
  return n;
}

void Links::send(NodeLink& n, const std::string& type, const Body& body, const Lost& lost) {
  try {
    n.link->send(type, body);
    flush_soon_ = flush_soon_ || n.link->pending();
  } catch (const LinkError& e) {
    lost(n, e.what());
  }
}

void Links::broadcast(const std::string& type, const Body& body, const Lost& lost) {
  for (auto& n : nodes_) {
    if (n->link) send(*n, type, body, lost);
  }
}

void Links::send_to(int node_rank, const std::string& type, const Body& body, const Lost& lost) {
  for (auto& n : nodes_) {
    if (n->node_rank != node_rank || !n->link) continue;
    send(*n, type, body, lost);
    return;
  }
}

void Links::sweep(Clock::time_point now, milliseconds heartbeat, milliseconds node_timeout,
                  const std::string& timeout_why, const Lost& lost) {
  bool pending = false;
  // Once a heartbeat interval: each link's retransmission ceiling fitted to its round trip.
  const bool fit_ceilings = now >= next_fit_;
  if (fit_ceilings) next_fit_ = now + heartbeat;
  for (auto& n : nodes_) {
    if (!n->link) continue;
    if (now - n->link->last_in() > node_timeout && now >= n->busy_until) {
      lost(*n, timeout_why);
      continue;
    }
    if (fit_ceilings) sys::tcp_fit_retransmission_ceiling(n->link->fd());
    try {
      if (now - n->link->last_out() >= heartbeat) {
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
  next_sweep_ = now + heartbeat / kSweepsPerHeartbeat;
}

void Links::flush_for(milliseconds limit) {
  const auto end = Clock::now() + limit;
  for (;;) {
    bool pending = false;
    for (auto& n : nodes_) {
      if (!n->link) continue;
      try {
        if (n->link->pending()) n->link->flush();
      } catch (const LinkError&) {
        drop(*n);
        continue;
      }
      sys::discard_input(n->link->fd());
      pending = pending || n->link->pending() || sys::tcp_unacknowledged(n->link->fd()) > 0;
    }
    if (!pending || Clock::now() >= end) return;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

}  // namespace lspawn::node
