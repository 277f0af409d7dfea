// lspawn::Hierarchy: the two levels a group spanning several nodes runs all_reduce, broadcast and
// all_gather on: shared memory among the members on one node, gloo among one leader per node.
//
//   node 0  ranks 0 1 ─shm─ leader 0 ══gloo══ leader 2 ─shm─ ranks 2 3  node 1
//
// Group (collectives/group.hpp) builds one for Backend::Auto when its members span nodes and some
// node holds more than one of them (Group::backend() == "hierarchical"); collectives/ops.cpp runs
// the three ops through it (docs/collectives.md#across-nodes has the algorithms and the costs):
//   all_reduce  shm all_reduce on each node → leaders all_reduce over gloo → shm broadcast
//   broadcast   shm broadcast from the root on its node → leaders broadcast over gloo → shm
//               broadcast from the leader on the other nodes
//   all_gather  shm all_gather on each node → leaders all_gather the node blocks over gloo →
//               shm broadcast of the whole output
// Every rank gets the same bits (one fold per node in rank order, gloo's ring among leaders, then
// copies). LSPAWN_BACKEND=gloo / Backend::Gloo forces flat gloo instead (for comparison).
//
// Layout: nodes are numbered in the order of their lowest member (group rank); a node's leader is
// its lowest member; the leaders' gloo group rank is the node number.
//
// Failures: a rank that sees a member of its node die (shm) writes a note into the group's store,
// first writer wins: "rank 3 died (node 1, host mn-b), seen by rank 2: …". Every rank whose op then
// fails — a leader whose gloo peer closed its connection, a member whose leader left — reads that
// note (waiting up to `note_wait` for it) and reports the rank that died first, not its own
// neighbour: fail() throws shm::Error (shm/communicator.hpp) naming that rank. From
// then on the hierarchy is broken: each op starts with check_usable(), which throws that failure
// again at once.
#pragma once

#include "shm/communicator.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lspawn {

// Which members of a group share a node. Pure: computed from the members' node ids.
struct NodeLayout {
  std::vector<std::vector<int>> members;  // per node: its group ranks, ascending (members[k][0] leads)
  std::vector<int> node_of;               // per group rank: its node
  std::vector<std::string> names;         // per node: host name (the node id up to its first '/')
  int node = 0;                           // this rank's node
  int local_rank = 0;                     // this rank's index in members[node]

  // `node_ids[q]`: the node id of group rank q (Group: host name + boot id, or LSPAWN_NODE_ID).
  static NodeLayout of(const std::vector<std::string>& node_ids, int rank);
  int nodes() const { return static_cast<int>(members.size()); }
  bool leader() const { return local_rank == 0; }
  // Largest number of members on one node.
  int max_members() const;
};

class Hierarchy {
 public:
  // `local`: this node's members (size 1 when alone: its ops are then local no-ops), with
  // CommOptions::shown_ranks = the members' group ranks. `leaders`: one rank per node, on leaders
  // only (null elsewhere). `store`: the hierarchy's namespace of the group's store (failure note).
  Hierarchy(NodeLayout layout, std::unique_ptr<shm::Communicator> local, c10::intrusive_ptr<c10d::ProcessGroup> leaders,
            c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds note_wait);

  const NodeLayout& layout() const { return layout_; }
  shm::Communicator& local() { return *local_; }
  // The leaders' gloo group (rank = node number); null on ranks that do not lead their node.
  c10d::ProcessGroup* leaders() { return leaders_.get(); }

  // Called with the exception a stage of an op threw; never returns. Throws shm::Error whose
  // ranks() are group ranks: for a shm failure, its kind, prefixed with the node (and, when a
  // member died, the note is left for the others); for any other failure (gloo), Kind::PeerDied
  // naming the rank of the group's failure note when one appears within `note_wait` — else the
  // exception is rethrown as it is.
  // The hierarchy is then broken (its ranks are at unknown stages of the op): check_usable()
  // throws that failure again, as shm::Error naming the same ranks, for every later op. And this
  // rank leaves it, so that nobody waits for it though it may live on (a trainer that catches
  // the error): its node's members that wait for it fail at once (shm::Error::Kind::PeerLeft),
  // and a leader closes its gloo connections, so the other leaders fail at once in their step.
  [[noreturn]] void fail(std::exception_ptr error);
  // Called by each op before its first stage: throws when an earlier op failed (fail()), so a
  // rank that goes on issuing ops after a failure (DDP's hook thread, bucket after bucket) does
  // not meet its node's members mid-op and report a mismatch instead of the first failure.
  void check_usable() const;

 private:
  [[noreturn]] void explain(std::exception_ptr error);  // fail()'s work
  void leave(const std::string& reason);                // fail()'s: shm abort, leaders closed
  struct Note {
    int rank;
    std::string text;
  };
  void publish(int rank, const std::string& text);                // first writer wins; never throws
  std::optional<Note> read_note(std::chrono::milliseconds wait);  // never throws

  NodeLayout layout_;
  std::unique_ptr<shm::Communicator> local_;
  c10::intrusive_ptr<c10d::ProcessGroup> leaders_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds note_wait_;
  // What fail() threw first; ops run one at a time (the Group's contract), so no lock.
  std::exception_ptr failure_;
};

}  // namespace lspawn
