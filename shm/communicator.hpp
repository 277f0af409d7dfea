// shm::Communicator: collectives among the ranks of one node through one shared-memory segment.
//
// What it guarantees
//   - all_reduce / broadcast / all_gather / barrier on raw buffers, for `size` processes on the
//     same host that construct it with the same rendezvous, in the same order (like any
//     collective). Every call is synchronous: it returns when this rank's output is complete.
//   - Identical output bits on every rank: each element of an all_reduce is folded by exactly one
//     rank, in rank order (srcs[0] op srcs[1] op …), and then copied to all.
//   - Every call either completes or throws shm::Error within `timeout`; while waiting it checks
//     that the peers it waits for are alive (pid in the segment, kill(pid, 0) and zombie state),
//     so a peer that died makes the others fail fast, naming the dead rank and its pid.
//   - Every call checks that all ranks called the same operation with the same type, count, op
//     and root (a descriptor each rank writes next to its data; costs a few loads): a mismatch
//     throws Error{Kind::Mismatch} naming the ranks that differ, on every rank.
//   - After any Error the communicator is broken (peers are at unknown points of the protocol):
//     later calls throw at once. Build a new one.
//   - A rank that leaves says so in the segment: its communicator broke (any Error here, or
//     abort(reason) from its owner, e.g. after a failure between nodes) or was destroyed. A peer
//     that waits for it then fails within milliseconds, Error{PeerLeft} naming it and its reason,
//     though its process is alive (a trainer that caught the error to recover) — not after the
//     whole timeout.
//
// How it works (docs/shm-backend.md has the full story)
//   One POSIX shm object, created by rank 0 under a unique name published through the
//   rendezvous, mapped by all, unlinked by rank 0 as soon as everybody has mapped it (before
//   rank 0's constructor returns, so nothing is left in /dev/shm whatever happens later). It holds one control line per rank (an arrival
//   counter, a pid, an operation descriptor) and two sets of per-rank staging slots used in
//   alternate rounds, so that a round never waits for the readers of the previous one. A round is:
//   write own slot → arrive (release increment of own counter) → wait until all counters reach
//   it (acquire) → read peers' slots. Waiting spins briefly, then yields, then sleeps on a futex
//   that the arriving rank wakes only when somebody sleeps (no syscall on the fast path); when
//   more ranks than CPUs share the node it skips the spinning.
//   all_reduce up to `flat_max_bytes`: one round, every rank folds all slots (lowest latency).
//   Larger: per chunk of `slot_bytes`, a reduce-scatter round (rank q folds region q of every
//   slot into slot 0) and an all-gather (everyone copies slot 0 out): two rounds per chunk.
//   With CommOptions::single_copy (off by default), from `single_copy_min_bytes` on and when
//   allowed: single copy (process_vm_readv/writev) for all_reduce, broadcast and all_gather:
//   2 rounds each, whatever the size.
#pragma once

#include "shm/reduce_kernels.hpp"
#include "proto/error.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lspawn::shm {

// A failure of a shm collective. `ranks` are the ranks concerned (dead, late, or mismatching).
class Error : public lspawn::Error {
 public:
  // PeerLeft: a peer this rank waited for left the group, alive (its communicator broke, was
  // aborted or destroyed; see Communicator::abort).
  enum class Kind { Timeout, PeerDied, Mismatch, Broken, System, PeerLeft };
  Error(Kind kind, std::vector<int> ranks, const std::string& what)
      : lspawn::Error(what), kind_(kind), ranks_(std::move(ranks)) {}
  Kind kind() const { return kind_; }
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  Kind kind_;
  std::vector<int> ranks_;
};

// How ranks find the segment: a tiny key/value exchange (the group's store). `get` blocks until
// the key exists and throws on its own timeout.
struct Rendezvous {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;
};

struct CommOptions {
  // Bytes of one per-rank staging slot; the segment holds 2 * size of them. Larger messages go
  // through in chunks of this size.
  std::size_t slot_bytes = std::size_t{1} << 20;
  // all_reduce of at most this many bytes uses the one-round flat path (<= slot_bytes).
  std::size_t flat_max_bytes = std::size_t{32} << 10;
  // A call that cannot complete throws Error{Timeout} after this long.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Single copy for all_reduce / broadcast / all_gather of at least `single_copy_min_bytes`
  // (per rank): ranks read and write each other's buffers directly with process_vm_readv/writev
  // (Linux cross-memory attach) instead of staging through the slots: half the memory traffic,
  // but every call pins the pages it touches. Off by default: where it was measured (2-core
  // VM, kernel 6.18) cross-memory attach moved ~10 GB/s against memcpy's ~45 GB/s, and the
  // staged path was faster at every size from 256 KiB to 64 MiB, N = 2 and 4, for all three ops
  // (docs/shm-backend.md, "Single copy or staged"). Used only when every rank's probe at
  // construction succeeds (same user, ptrace allowed). Env LSPAWN_SHM_SINGLE_COPY=1 / =0
  // overrides this either way; another value is an error.
  bool single_copy = false;
  std::size_t single_copy_min_bytes = std::size_t{1} << 20;
  // Label put into the shm object name (run id, group name): helps whoever lists /dev/shm.
  std::string label = "lspawn";
  // The numbers error messages give the ranks (e.g. their ranks in a larger group spanning
  // nodes, collectives/hierarchy.hpp): rank q is shown as "rank shown_ranks[q]". Empty → q.
  // Error::ranks() stay this communicator's ranks.
  std::vector<int> shown_ranks;
};

// LSPAWN_SHM_SINGLE_COPY: -1 when unset or empty, else 0 or 1; another value throws
// Error{System} naming it (every Communicator reads it; Group checks it before connecting).
int single_copy_from_env();

class Communicator {
 public:
  // Collective: all `size` ranks construct it with the same rendezvous and options.
  // Throws Error{System} (shm_open/mmap with errno text) or Error{Timeout}.
  Communicator(int rank, int size, const Rendezvous& rendezvous, CommOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  bool broken() const { return broken_; }
  // Leaves the group: this communicator is broken, and the peers that wait for this rank, now or
  // in a later op, fail at once with Error{PeerLeft} quoting `reason` (its first 191 bytes). For
  // an owner whose op failed outside the segment (the leaders' step between nodes), so that its
  // node's ranks, waiting on it, do not wait out the timeout. Idempotent: the first reason stays.
  // In a process forked from the rank (its copy of this object) it only breaks that copy.
  // The one call that may come from another thread while an op runs (a watchdog, torch's
  // ProcessGroup.abort()): that op then throws Error{Broken} within ~20 ms ("aborted while
  // waiting"), instead of waiting out the timeout.
  void abort(const std::string& reason);
  // True when large all_reduces use the single-copy path (see CommOptions::single_copy).
  bool single_copy() const { return single_copy_; }

  // In place: data[i] = op over ranks of data[i]. Precondition: kernel_supports(type, op).
  void all_reduce(void* data, std::size_t count, ElemType type, KernelOp op);
  // `bytes` from `root`'s buffer into every rank's buffer.
  void broadcast(void* data, std::size_t bytes, int root);
  // out (size * bytes) = concatenation of every rank's `in` (bytes each), in rank order.
  void all_gather(const void* in, std::size_t bytes, void* out);
  void barrier();

 private:
  struct Segment;
  struct Desc;
  void begin_round(const Desc& desc);  // publish descriptor, arrive, wait for all, check
  void arrive();
  void wait_all(std::uint32_t target, const char* what);
  void check_descs(const Desc& mine);
  unsigned char* slot(int set, int rank) const;
  void probe_single_copy();
  void peer_copy(int q, void* local, std::uint64_t remote, std::size_t bytes, bool to_peer);
  void all_reduce_single_copy(unsigned char* data, std::size_t count, ElemType type, KernelOp op, const Desc& d);
  [[noreturn]] void fail(Error e);  // abort(e.what()), then throw e
  void leave(std::uint32_t how, const std::string& reason);
  int shown(int q) const;  // q as messages name it (CommOptions::shown_ranks)
  std::string me() const;  // "rank 2/4 (pid 123)" or, with shown_ranks, "rank 5 (2/4 here, pid 123)"

  int rank_;
  int size_;
  CommOptions options_;
  Segment* seg_ = nullptr;  // mapped control block
  std::size_t map_bytes_ = 0;
  unsigned char* data_ = nullptr;            // first slot
  std::uint64_t round_ = 0;                  // rounds completed by this rank (same on all ranks)
  bool oversubscribed_ = false;              // more ranks than online CPUs: do not spin
  std::atomic<bool> broken_{false};          // abort() may come from another thread
  bool single_copy_ = false;                 // every rank can process_vm_readv every other
  std::uint64_t canary_ = 0;                 // read by the neighbour's probe at construction
  std::vector<const void*> srcs_;            // all_reduce: the slots to fold, in rank order (no allocation per call)
  std::vector<unsigned char> piece_buffer_;  // single copy all_reduce: size pieces (peers' + result)
  const char* current_op_ = "";
  std::uint64_t epoch_ = 0;  // data rounds started: picks the slot set (epoch % 2)
};

}  // namespace lspawn::shm
