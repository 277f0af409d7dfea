// The rendezvous endpoint as the rendezvous (rendezvous.hpp) and an elastic job's admission
// (admission.hpp) both serve it: connections accepted there that want to join, how many may wait
// without a join message and for how long, and whether a join fits the job. No state of its own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cluster/node_channel.hpp"
#include "cluster/node_group_options.hpp"
#include "sys/sys.hpp"

namespace lspawn::node {

// A connection to the rendezvous endpoint that is not (yet) a node of the job: before the job
// formed, or after it formed (elastic), a node that wants to join.
struct Joiner {
  std::unique_ptr<Link> link;
  std::optional<JoinMsg> join;  // its join, accepted (answered with JoinedMsg)
  std::string endpoint;         // "IP:PORT" of the peer, for what is said about a stranger
  sys::Clock::time_point accepted_at;
};

// Connections to the rendezvous endpoint that have not sent their join message yet: at most
// this many at a time (more wait in the kernel's backlog, or are closed as they come once the job
// formed), each for at most --node-timeout. A real lspawn joins as soon as it connects; without
// these bounds a port scanner or a stuck peer would hold the coordinator's fds for the whole job.
inline constexpr int kMaxUnjoined = 64;

// "HOST:PORT" of the rendezvous endpoint.
std::string endpoint_of(const NodeGroupOptions& o);

// Accepts the connections waiting on `listener` (the rendezvous endpoint `ep`): `add` gets the
// first `max` ones' links ("node at IP") and "IP:PORT". Beyond `max`: with `beyond` null, the
// rest stay in the kernel's backlog; else each is accepted, given to `beyond` ("IP:PORT") and
// closed.
void accept_nodes(int listener, const std::string& ep, std::chrono::milliseconds node_timeout, int max,
                  const std::function<void(std::unique_ptr<Link>, std::string)>& add,
                  const std::function<void(const std::string&)>& beyond = {});

// When a connection accepted at `accepted_at` that has sent no join message is closed: once the
// clock is past it. (A wake-up for it is 1 ms later, to be past it.)
inline sys::Clock::time_point join_due(sys::Clock::time_point accepted_at, std::chrono::milliseconds node_timeout) {
  return accepted_at + node_timeout;
}

// A connection that has sent no join message within --node-timeout of its accept: what is said
// when it is closed.
std::string join_overdue(const std::string& ep, const std::string& endpoint, std::chrono::milliseconds node_timeout);

// Why `j` cannot be part of the job `o` describes; empty when it can.
std::string join_mismatch(const NodeGroupOptions& o, const JoinMsg& j);

// A connection whose bytes are no frame of the channel's (not an lspawn): said, naming the sender.
bool not_our_frames(const LinkError& e);

}  // namespace lspawn::node
