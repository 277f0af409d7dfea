// RecordedBackend<Base>: a c10d backend (ProcessGroupGloo, ProcessGroupNCCL, or a subclass) whose
// collectives enter and leave the rank's status record (status/recorder.hpp) as lspawn's own
// collectives do, so the hang watch sees a rank that waits in `world.pg->allreduce(...)`, in DDP's
// Reducer or in anything else issued on a process group lspawn built (docs/hang-diagnosis.md).
//
//   auto pg = c10::make_intrusive<RecordedBackend<c10d::ProcessGroupGloo>>(store, rank, size, opts);
//   pg->record().open("world.pg", rank, size);   // claims the slot: the rank is a known member
//   ... the backend's own set-up (a barrier) ...
//   pg->record().start();                         // from here on every collective is recorded
//
// What is recorded: allreduce, allreduce_coalesced, broadcast, reduce, allgather,
// allgather_coalesced, gather, scatter, reduce_scatter and barrier, with the group's sequence
// number, the payload on this rank and the time entered; an op is left when its Work completes
// (gloo: its future's callback, on gloo's thread; NCCL, whose future completes when the kernels
// are queued: a poller thread asks Work::isCompleted() every 20 ms). Not recorded: point-to-point
// (send/recv), the *_base/_single tensor variants whose names differ between LibTorch versions,
// alltoall, and every op of a process group the program built itself.
//
// Cost on the issuing thread: one sequence increment, the slot's seqlock section (one CAS: the
// slot has two writers) and, for gloo, one callback added to the Work's future (an allocation):
// bench/status measures it (docs/benchmarks.md).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "status/recorder.hpp"

namespace lspawn {

// While one lives on a thread, RecordedBackends do not record the ops that thread issues:
// lspawn's collectives record an op in their group's own slot and run it on a process group of
// their own (collectives/ops.cpp), and an op a backend runs through another of its ops is one op.
class RecordingPause {
 public:
  RecordingPause() noexcept { ++depth(); }
  ~RecordingPause() { --depth(); }
  RecordingPause(const RecordingPause&) = delete;
  RecordingPause& operator=(const RecordingPause&) = delete;
  static bool active() noexcept { return depth() > 0; }

 private:
  static int& depth() noexcept {
    static thread_local int d = 0;
    return d;
  }
};

// How an op is known to be complete: by its Work's future (gloo), or by polling the Work (NCCL).
enum class Completion { Future, Poll };

// One backend's record: its slot, its sequence numbers and what leaves the ops it entered.
class BackendRecord {
 public:
  BackendRecord() = default;
  ~BackendRecord();
  BackendRecord(const BackendRecord&) = delete;
  BackendRecord& operator=(const BackendRecord&) = delete;

  // Claims the slot `name` in this process's record (no-op when lspawn's status record is off).
  void open(const std::string& name, int group_rank, int group_size, Completion completion = Completion::Future);
  // Ops issued from now on are recorded (the set-up's own ops are not the program's).
  void start() { on_.store(slot_.enabled(), std::memory_order_release); }
  bool recording() const { return on_.load(std::memory_order_acquire) && !RecordingPause::active(); }

  // Records `op` around start(), which returns the op's Work.
  template <typename Start>
  c10::intrusive_ptr<c10d::Work> run(const char* op, std::uint64_t bytes, Start&& start) {
    if (!recording()) return start();
    const std::uint64_t seq = seq_.fetch_add(1, std::memory_order_relaxed) + 1;
    slot_.enter(op, seq, bytes);
    c10::intrusive_ptr<c10d::Work> work;
    {
      RecordingPause nested;  // an op this backend runs on another of its own ops
      try {
        work = start();
      } catch (...) {
        slot_.complete(seq);
        throw;
      }
    }
    watch(seq, work);
    return work;
  }

 private:
  void watch(std::uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work);
  void poll_loop();

  Completion completion_ = Completion::Future;
  status::SlotWriter slot_;
  std::atomic<std::uint64_t> seq_{0};
  std::atomic<bool> on_{false};
  // Completion::Poll (and Works without a future): the ops in flight, oldest first.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::uint64_t, c10::intrusive_ptr<c10d::Work>>> inflight_;
  bool stopping_ = false;
  std::thread poller_;
};

inline std::uint64_t bytes_of(const std::vector<at::Tensor>& ts) {
  std::uint64_t n = 0;
  for (const auto& t : ts)
    if (t.defined()) n += static_cast<std::uint64_t>(t.nbytes());
  return n;
}

template <typename Base>
class RecordedBackend : public Base {
 public:
  template <typename... Args>
  explicit RecordedBackend(Args&&... args) : Base(std::forward<Args>(args)...) {}

  BackendRecord& record() { return record_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t,
                                           const c10d::AllreduceOptions& o = c10d::AllreduceOptions()) override {
    return record_.run("all_reduce", bytes_of(t), [&] { return Base::allreduce(t, o); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& t,
      const c10d::AllreduceCoalescedOptions& o = c10d::AllreduceCoalescedOptions()) override {
    return record_.run("all_reduce_coalesced", bytes_of(t), [&] { return Base::allreduce_coalesced(t, o); });
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t,
                                           const c10d::BroadcastOptions& o = c10d::BroadcastOptions()) override {
    return record_.run("broadcast", bytes_of(t), [&] { return Base::broadcast(t, o); });
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t,
                                        const c10d::ReduceOptions& o = c10d::ReduceOptions()) override {
    return record_.run("reduce", bytes_of(t), [&] { return Base::reduce(t, o); });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o = c10d::AllgatherOptions()) override {
    return record_.run("all_gather", bytes_of(in), [&] { return Base::allgather(out, in, o); });
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o = c10d::AllgatherOptions()) override {
    return record_.run("all_gather_coalesced", bytes_of(in), [&] { return Base::allgather_coalesced(out, in, o); });
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o = c10d::GatherOptions()) override {
    return record_.run("gather", bytes_of(in), [&] { return Base::gather(out, in, o); });
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o = c10d::ScatterOptions()) override {
    return record_.run("scatter", bytes_of(out), [&] { return Base::scatter(out, in, o); });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
      const c10d::ReduceScatterOptions& o = c10d::ReduceScatterOptions()) override {
    return record_.run("reduce_scatter", bytes_of(out), [&] { return Base::reduce_scatter(out, in, o); });
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o = c10d::BarrierOptions()) override {
    return record_.run("barrier", 0, [&] { return Base::barrier(o); });
  }

 private:
  BackendRecord record_;
};

}  // namespace lspawn
