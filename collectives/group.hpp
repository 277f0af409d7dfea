// lspawn::Group: a set of ranks that run collectives together (collectives/ops.hpp,
// collectives/object.hpp), over gloo and, among ranks of one node, shared memory.
//
//   auto world = lspawn::Group::create(store, rank, size);            // or Group::from_world(w)
//   lspawn::all_reduce(*world, grads, lspawn::ReduceOp::Mean);
//   auto evens = world->new_group({0, 2});                              // nullptr on ranks 1, 3
//
// Guarantees
//   - Creation is collective: every rank of the group calls create() (every rank of the parent
//     calls new_group(), in the same order); it returns once the backends are connected.
//   - Each group owns a namespace of the store (PrefixStore "<name>/"): the keys of a subgroup
//     never collide with its parent's or a sibling's, and collectives on one group do not disturb
//     another (distinct gloo pairs, distinct shm segments).
//   - Backend: gloo always exists (it carries the ops shm does not implement). With
//     Backend::Shm, or Backend::Auto when all members run on one node (same host name and boot id,
//     or same LSPAWN_NODE_ID), the ops listed in docs/shm-backend.md go through shared memory.
//     With Backend::Auto when the members span nodes and some node holds several of them,
//     all_reduce, broadcast and all_gather (and reduce, reduce_scatter, built on all_reduce) are
//     hierarchical: shm inside each node, gloo between one leader per node
//     (collectives/hierarchy.hpp). Backend::Gloo keeps every op on flat gloo.
//   - Errors: CollectiveError and subclasses (collectives/error.hpp), naming the op, the group
//     and the ranks concerned. After one, the group is unusable (other ranks may be anywhere).
//
// Threading: like c10d, collectives of one group are issued from one thread at a time, in the
// same order on every rank. Different groups may be used from different threads.
#pragma once

#include "status/recorder.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lspawn {

class BackendRecord;  // runtime/recorded_backend.hpp
class CudaIpc;        // collectives/cuda_ipc.hpp
class Hierarchy;      // collectives/hierarchy.hpp
namespace shm {
class Communicator;  // shm/communicator.hpp
}

struct World;  // runtime/process_group.hpp

enum class Backend {
  Default,  // env LSPAWN_BACKEND (shm|gloo|auto), else Auto
  Auto,     // shm among ranks of one node; across nodes shm inside each node + gloo between
            // nodes (hierarchical), or flat gloo when every node holds one member
  Gloo,     // gloo only, flat (loopback TCP on one node; no hierarchy across nodes)
  Shm,      // shm for what it implements; creation fails if the members span several nodes
  Nccl,     // c10d ProcessGroupNCCL for every op (CUDA tensors). Only in builds configured with
            // LSPAWN_WITH_NCCL against a CUDA LibTorch (have_nccl_backend()); else creation throws.
};
// True when this build can create Backend::Nccl groups.
bool have_nccl_backend();
const char* to_string(Backend b);

struct GroupOptions {
  Backend backend = Backend::Default;
  // A collective that cannot complete fails after this long. Zero → env LSPAWN_PG_TIMEOUT
  // (seconds), else 30 min (torch's default).
  std::chrono::milliseconds timeout{0};
  // Checked mode: before each gloo collective, the ranks exchange (op, sequence number, dtype,
  // shape, root, reduce op) with a small all_gather and throw CollectiveMismatch on a difference.
  // Costs one extra small all_gather per op (~0.3 ms on gloo). The shm path always checks (free).
  // false → env LSPAWN_COLLECTIVES_CHECKED=1 turns it on.
  bool checked = false;
  // Address gloo binds to. "" → 127.0.0.1 when all members are on one node; else env
  // LSPAWN_GLOO_HOST, else the interface env GLOO_SOCKET_IFNAME names, else the address that
  // resolves from this host's name (gloo's default device). from_world() passes the world's.
  std::string gloo_host;
  // Shared-memory staging slot per rank (two sets per rank are mapped) and the all_reduce size
  // up to which the one-round flat path is used. See shm/communicator.hpp.
  std::size_t shm_slot_bytes = std::size_t{1} << 20;
  std::size_t shm_flat_max_bytes = std::size_t{32} << 10;
  // Name of the group in errors and in the store ("world" for a root group).
  std::string name = "world";
};

class Group {
 public:
  // Collective over `size` processes. `store` is shared by all of them (a TCPStore client or
  // server, usually already prefixed for the run); the group works under "<name>/" in it.
  // Throws CollectiveError when a backend cannot be set up (naming rank, size and cause).
  static std::shared_ptr<Group> create(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                       GroupOptions options = {});

  // From runtime's init_process_group(): uses world.store and world.peers (their hosts decide
  // shm eligibility). Its own gloo pairs; world.pg stays usable for the caller.
  static std::shared_ptr<Group> from_world(const World& world, GroupOptions options = {});

  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  bool checked() const { return options_.checked; }
  // "gloo", "shm+gloo" (shm for the ops it implements, gloo for the rest), "hierarchical" (shm
  // inside nodes + gloo between them for the ops Hierarchy implements, gloo for the rest) or "nccl".
  std::string backend() const;
  // Ranks of the members in the root group, indexed by this group's rank.
  const std::vector<int>& root_ranks() const { return root_ranks_; }

  // Collective over this group: every member calls it with the same `ranks` (ranks of this
  // group, distinct, any order: the new group's rank i is ranks[i]). Returns nullptr on ranks not
  // in `ranks`. The subgroup inherits this group's options, with name "<name>.<n>".
  std::shared_ptr<Group> new_group(const std::vector<int>& ranks, GroupOptions options);
  std::shared_ptr<Group> new_group(const std::vector<int>& ranks);

  // The c10d process group (gloo; NCCL for Backend::Nccl): for code that wants c10d itself
  // (e.g. torch's DDP Reducer).
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return gloo_; }
  // The shm communicator, or nullptr when this group does not use shm.
  shm::Communicator* shm() { return shm_.get(); }
  // CUDA tensors over shm device to device (collectives/cuda_ipc.hpp), or nullptr: no shm, a
  // LibTorch without CUDA, or LSPAWN_SHM_CUDA_IPC=0.
  CudaIpc* cuda_ipc() { return cuda_ipc_.get(); }
  // The two-level structure across nodes, or nullptr when this group is not hierarchical.
  Hierarchy* hierarchy() { return hier_.get(); }
  // The group's own namespace of the store.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // --- used by the collectives (collectives/ops.cpp, object.cpp) -----------------------------
  // Numbers the collectives of this group: 1, 2, … on every rank that calls them in order.
  std::uint64_t next_sequence() { return ++sequence_; }
  // This rank's status slot for the group (status/recorder.hpp): the collectives record in it
  // which op they are in (docs/hang-diagnosis.md). Disabled outside lspawn (no LSPAWN_STATUS_DIR).
  status::SlotWriter& status_slot() { return status_; }
  // On a failure: records that this rank reached op `sequence`, waits up to `wait` for the
  // others to record theirs, and returns the group ranks that did not (never throws; empty when
  // the store is unreachable).
  std::vector<int> ranks_not_reaching(std::uint64_t sequence, std::chrono::milliseconds wait);
  // "group 'world' (rank 1/4, pid 123, backend shm+gloo)".
  std::string describe() const;

 private:
  Group() = default;
  static std::shared_ptr<Group> build(c10::intrusive_ptr<c10d::Store> store, int rank, int size, GroupOptions options,
                                      std::vector<std::string> node_ids, std::vector<int> root_ranks);

  int rank_ = 0;
  int size_ = 1;
  GroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> gloo_;
  BackendRecord* pg_record_ = nullptr;  // gloo_'s record of the ops others issue on it (DDP's Reducer)
  std::unique_ptr<shm::Communicator> shm_;
  std::unique_ptr<CudaIpc> cuda_ipc_;
  std::unique_ptr<Hierarchy> hier_;
  std::vector<std::string> node_ids_;  // per group rank: host identity
  std::vector<int> root_ranks_;
  std::uint64_t sequence_ = 0;
  status::SlotWriter status_;
  int subgroups_ = 0;
  bool nccl_ = false;  // gloo_ holds a ProcessGroupNCCL  // new_group() calls so far: names the next one
};

}  // namespace lspawn
