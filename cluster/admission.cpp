#include "cluster/admission.hpp"

#include <algorithm>

#include "cluster/membership.hpp"

namespace lspawn::node {

void Admission::open(sys::Fd listener, bool listener_watched, std::string endpoint, std::vector<Joiner> unjoined) {
  if (!listener_watched) links_.poller().add(listener.get());
  listener_ = std::move(listener);
  endpoint_ = std::move(endpoint);
  for (auto& j : unjoined) joiners_.push_back(std::make_unique<Joiner>(std::move(j)));
}

std::optional<Admission::Admitted> Admission::on_ready(int fd, const std::function<RoundView()>& view) {
  std::optional<Admitted> admitted;
  if (listener_ && fd == listener_.get()) {
    accept();
    return admitted;
  }
  for (size_t i = 0; i < joiners_.size(); ++i) {  // a few at most (kMaxUnjoined)
    if (joiners_[i]->link->fd() != fd) continue;
    on_joiner_readable(i, view, &admitted);
    break;
  }
  return admitted;
}

// Connections beyond kMaxUnjoined without a join are closed at once (said the first time), so
// strangers cannot hold the coordinator's fds.
void Admission::accept() {
  const int unjoined = static_cast<int>(joiners_.size()) - waiting();
  accept_nodes(
      listener_.get(), endpoint_, o_.node_timeout, std::max(kMaxUnjoined - unjoined, 0),
      [this](std::unique_ptr<Link> link, std::string endpoint) {
        links_.poller().add(link->fd());
        joiners_.push_back(std::make_unique<Joiner>(Joiner{std::move(link), {}, std::move(endpoint), Clock::now()}));
      },
      [this](const std::string& endpoint) {
        if (unjoined_full_said_) return;
        info("rendezvous on " + endpoint_ + ": closed connection from " + endpoint + ": " +
             std::to_string(kMaxUnjoined) +
             " connections have not sent a join message yet, the most there may be (further ones are closed "
             "without a word)");
        unjoined_full_said_ = true;
      });
}

int Admission::waiting() const {
  int n = 0;
  for (auto& j : joiners_) n += j->join.has_value();
  return n;
}

// A node that wants to join: checked as at the rendezvous; accepted (and answered), it waits for
// the next round, which begins at once unless the round is ending already (a failure) or some
// node's workers are done (the job may be about to succeed). Returns why it is turned away, or "".
std::string Admission::admit_or_refuse(Joiner& jn, const JoinMsg& j, const std::function<RoundView()>& view,
                                       std::optional<Admitted>* admitted) {
  if (std::string why = join_mismatch(o_, j); !why.empty()) return jn.link->peer() + " (" + j.host + ") " + why;
  const RoundView v = view();
  if (v.ended) return jn.link->peer() + " (" + j.host + ") came after the job ended";
  if (v.nodes_alive + waiting() >= o_.nnodes) {
    return jn.link->peer() + " (" + j.host + ") cannot join: the job has its --nnodes " +
           nnodes_flag(o_.min_nnodes, o_.nnodes) + " maximum of " + std::to_string(o_.nnodes) + " nodes";
  }
  jn.join = j;
  jn.link->set_peer(j.host + " (" + sys::peer_ip(jn.link->fd()) + ")");
  jn.link->send("joined", JoinedMsg{v.nodes_alive + waiting()});
  if (!v.every_node_running) {
    info("node " + jn.link->peer() + " wants to join: it is admitted if the job goes on to a next round");
    return "";
  }
  *admitted = Admitted{jn.link->peer(), j.host};
  return "";
}

void Admission::on_joiner_readable(size_t i, const std::function<RoundView()>& view,
                                   std::optional<Admitted>* admitted) {
  Joiner& jn = *joiners_[i];
  std::string turned_away;  // said to the peer and here
  try {
    for (auto& m : jn.link->read()) {
      if (m.type != "join" || jn.join) continue;
      turned_away = admit_or_refuse(jn, m.as<JoinMsg>(), view, admitted);
      break;
    }
  } catch (const LinkError& e) {
    // Gone (said when it had joined), or not an lspawn (said as at the rendezvous).
    if (jn.join) {
      info("node " + jn.link->peer() + ", waiting to join, went away: " + e.what());
    } else if (not_our_frames(e)) {
      info("rendezvous on " + endpoint_ + ": rejected connection from " + jn.endpoint + ": " + e.what());
    }
    drop(i);
    return;
  } catch (const BadMessage& e) {
    turned_away = "connection from " + jn.endpoint + ": bad join message (" + e.what() + ")";
  }
  if (turned_away.empty()) return;
  info("rendezvous on " + endpoint_ + ": rejected " + turned_away);
  try {
    jn.link->send("reject", RejectMsg{"rendezvous on " + endpoint_ + ": " + turned_away});
  } catch (const LinkError&) {}
  drop(i);
}

void Admission::drop(size_t i) {
  links_.poller().remove(joiners_[i]->link->fd());
  joiners_.erase(joiners_.begin() + static_cast<long>(i));
}

void Admission::drop_overdue(Clock::time_point now) {
  for (size_t i = 0; i < joiners_.size(); ++i) {
    if (joiners_[i]->join || now <= join_due(joiners_[i]->accepted_at, o_.node_timeout)) continue;
    info(join_overdue(endpoint_, joiners_[i]->endpoint, o_.node_timeout));
    drop(i);
    --i;
  }
}

std::vector<NodeLink*> Admission::admit_waiting(AssignMsg& assign) {
  links_.erase_lost();
  std::vector<int> old_ranks;
  for (auto& n : links_.nodes()) old_ranks.push_back(n->node_rank);
  std::vector<NodeLink*> fresh;
  for (size_t i = 0; i < joiners_.size(); ++i) {
    if (!joiners_[i]->join) continue;
    auto n = std::make_unique<NodeLink>();
    n->host = joiners_[i]->join->host;
    n->addr = sys::peer_ip(joiners_[i]->link->fd());
    n->link = std::move(joiners_[i]->link);
    fresh.push_back(&links_.add(std::move(n), false));  // watched since its accept
    joiners_.erase(joiners_.begin() + static_cast<long>(i));
    --i;
  }
  auto& nodes = links_.nodes();
  const std::vector<int> rank = elastic_node_ranks(old_ranks, static_cast<int>(fresh.size()));
  for (size_t i = 0; i < nodes.size(); ++i) nodes[i]->node_rank = rank[i];
  std::stable_sort(nodes.begin(), nodes.end(),
                   [](const auto& a, const auto& b) { return a->node_rank < b->node_rank; });
  assign.nnodes = static_cast<int>(nodes.size()) + 1;
  assign.node_rank = 0;
  assign.coordinator = 0;
  assign.hosts = {o_.host};
  for (auto& n : nodes) {
    n->link->set_peer("node " + std::to_string(n->node_rank) + " (" + n->host + ", " + n->addr + ")");
    assign.hosts.push_back(n->host);
  }
  return fresh;
}

void Admission::job_ended(int exit_code) {
  for (auto& j : joiners_) {
    if (!j->join) continue;
    try {
      j->link->send("reject", RejectMsg{"rendezvous on " + endpoint_ + ": the job ended (exit code " +
                                        std::to_string(exit_code) + ") before this node could join"});
    } catch (const LinkError&) {}
  }
}

}  // namespace lspawn::node
