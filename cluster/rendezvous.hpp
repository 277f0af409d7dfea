// How the lspawns of a job meet (docs/multi-node.md): the node group's rendezvous, which
// NodeGroup::form() (node_group.hpp) runs, blocking, before the job's first round.
//
// The coordinator listens on the rendezvous endpoint (static mode: --master-addr:--master-port,
// and node 0 is the coordinator; --rdzv-endpoint mode: whichever lspawn can bind the endpoint),
// every other lspawn connects and sends JoinMsg, which the coordinator checks against its own job
// (endpoint.hpp's join_mismatch: a mismatch rejects every node) and answers at once (JoinedMsg).
// The coordinator's side is one state, rendezvous_state.hpp's table (Waiting, LastCall, Formed,
// TimedOut, Rejected) moved by Formation: Formed when --nnodes have joined (elastic: MAX at once,
// or at least MIN once the last call has passed since MIN joined, or at the rendezvous timeout).
// Then it assigns node ranks (the ones given; the others in join order, coordinator first;
// membership.hpp), the run id (--run-id/--rdzv-id, else a random one drawn by the coordinator:
// every node gets the same), and the workers' MASTER_ADDR/MASTER_PORT (node 0's address, a port
// node 0 reserved), and sends AssignMsg: round 0 starts.
// While it gathers, at most kMaxUnjoined connections may be without a join (endpoint.hpp): the
// listener is watched exactly while there are fewer, so the next ones wait in the kernel's
// backlog (a thousand nodes connecting at once all get in, none is turned away).
// A fixed job's endpoint closes when it formed (later lspawns get "connection refused", the ones
// connected without a join a reject); an elastic job's stays open, for admission.hpp.
//
// A node that can neither host nor join (--rdzv-endpoint mode: bind fails and nothing that
// answers a join listens there; static mode: node 0 cannot be reached) tries again (hosting
// too, in --rdzv-endpoint mode) and says what it tried and what answered 3 s after it began and
// then every 5 s ("bind: Address already in use", "connect: Connection refused", "HOST:PORT
// accepted the connection but sent nothing lspawn understands in 3 s"); the rendezvous
// timeout's error names that cause. A connection that was accepted but is silent is kept (a
// coordinator that answers late is still joined), one that closes or sends bytes that are no
// frame of the channel's is dropped and the node tries again. A member whose join was answered
// waits for its assignment (Formed), a reject (Rejected) or the deadline (TimedOut).
//
// nnodes == 1: no channel at all; the job is formed at once (one node, node 0).
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cluster/endpoint.hpp"
#include "cluster/links.hpp"
#include "cluster/node_group_options.hpp"
#include "supervisor/port.hpp"
#include "proto/error.hpp"

namespace lspawn::node {

// The node group's rendezvous failed: not every node came within the timeout, the nodes disagree
// on the job (nproc, nnodes, run id), node ranks clash, or the coordinator could not be reached.
// (Named NodeRendezvousError, not RendezvousError: lspawn::RendezvousError, runtime/, is the
// workers' rendezvous on the store.)
class NodeRendezvousError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

// What the rendezvous leaves for the node group: everything it needs to run the job's rounds.
struct FormedJob {
  bool coordinator = true;
  AssignMsg assign;                            // round 0's (an elastic job's joiner: the round it joins)
  std::optional<PortReservation> master_port;  // node 0: the workers' store port, held
  std::unique_ptr<Links> links;                // coordinator: one per member; member: the coordinator
  // An elastic coordinator: the endpoint stays open (admission.hpp), with the connections that had
  // sent no join yet.
  sys::Fd listener;
  bool listener_watched = false;  // in links->poller() already
  std::string endpoint;           // "HOST:PORT" of the rendezvous
  std::vector<Joiner> unjoined;
  // Coordinator: members whose connection broke while their assignment was sent (lost at once).
  std::vector<std::pair<NodeLink*, std::string>> broken;
  // Member: what the coordinator sent after the assignment (handled first).
  std::vector<Message> queued;
  std::string formed_line;  // "rendezvous: 3 nodes joined after 1.2 s", said once the group exists
};

// Blocks until the job's nodes have met (throws NodeRendezvousError, or PortError when the static
// coordinator cannot listen on --master-port). nnodes == 1: returns at once; `solo_master_port`
// is then the workers' MASTER_PORT (0: a free one).
FormedJob rendezvous(const NodeGroupOptions& o, int solo_master_port);

}  // namespace lspawn::node
