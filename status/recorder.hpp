// status::Recorder: the writing side of the per-rank status record (status/layout.hpp).
//
//   auto& rec = lspawn::status::Recorder::process();   // from LSPAWN_STATUS_DIR and RANK
//   lspawn::status::SlotWriter slot = rec.add_group("world", rank, size);   // at group creation
//   slot.enter("all_reduce", seq, bytes);   // collectives/ops.cpp, at the start of op #seq
//   slot.complete(seq);                     // when op #seq completed (or failed)
//
// Cost: enter() and complete() are a few atomic stores (plain moves on x86) and one
// clock_gettime(CLOCK_REALTIME_COARSE) (vDSO): no system call, no lock, no allocation
// (bench/status/recorder_bench.cpp measures it; docs/benchmarks.md).
//
// A disabled Recorder (no LSPAWN_STATUS_DIR, or the file could not be created) hands out
// disabled SlotWriters whose calls do nothing: code that records never checks.
//
// Writers::Many: a slot written from several threads (a c10d backend's ops entered by the caller,
// completed on the backend's own threads, runtime/recorded_backend.hpp) takes its seqlock with
// one compare-and-swap instead of a plain store, so two writers never interleave.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "status/layout.hpp"

namespace lspawn::status {

// Writes one group's slot. Copyable handle; the slot lives as long as its Recorder (the
// process's recorder lives until the process ends). One writer thread at a time per slot, unless
// it was claimed for Writers::Many.
// Who writes a slot: one thread at a time (lspawn's collectives), or any thread at any time.
enum class Writers { One, Many };

class SlotWriter {
 public:
  SlotWriter() = default;  // disabled
  explicit SlotWriter(GroupSlot* slot, Writers writers = Writers::One) : slot_(slot), many_(writers == Writers::Many) {}

  bool enabled() const { return slot_ != nullptr; }
  // This rank entered op #seq of the group (`op`: a name such as "all_reduce", cut to 23 chars).
  void enter(const char* op, std::uint64_t seq, std::uint64_t bytes);
  // Op #seq completed, successfully or not. When it is the op last entered, the slot becomes
  // Idle; an older one (async ops completing out of order) only advances completed_seq.
  void complete(std::uint64_t seq);

 private:
  GroupSlot* slot_ = nullptr;
  bool many_ = false;
};

class Recorder {
 public:
  Recorder() = default;  // disabled
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Creates `<dir>/rank-<rank>.status` (replacing an older one atomically) and maps it.
  // Throws std::system_error naming the call and the path.
  static std::unique_ptr<Recorder> create(const std::string& dir, int rank);

  // This process's recorder, from LSPAWN_STATUS_DIR and RANK, opened at the first call (and again
  // in a forked child: the record belongs to the pid that writes it). Disabled when either
  // variable is unset; when the file cannot be created it says so once on stderr and is
  // disabled. Also installs the stack-dump handler (status/stack_dump.hpp) when enabled.
  static Recorder& process();

  bool enabled() const { return header_ != nullptr; }
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }
  int rank() const { return rank_; }

  // Claims a slot for a group this rank belongs to. Disabled writer when the slots ran out
  // (counted in FileHeader::groups_dropped) or the recorder is disabled. Thread-safe.
  SlotWriter add_group(const std::string& name, int group_rank, int group_size, Writers writers = Writers::One);
  // Publishes the signal whose handler dumps the main thread's stack (0: none).
  void set_stack_signal(int sig);

 private:
  FileHeader* header_ = nullptr;
  void* map_ = nullptr;
  std::string path_;
  std::string dir_;
  int rank_ = -1;
  std::mutex add_group_mutex_;  // groups may be created from several threads
};

// CLOCK_REALTIME_COARSE in µs (the clock of every *_us field: wall time, comparable across
// processes and, as far as their clocks agree, nodes; resolution one kernel tick, 1-4 ms).
std::int64_t now_us();

}  // namespace lspawn::status
