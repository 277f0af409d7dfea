#include "runtime/recorded_backend.hpp"

#include <chrono>

#include <ATen/core/ivalue.h>

namespace lspawn {

void BackendRecord::open(const std::string& name, int group_rank, int group_size, Completion completion) {
  completion_ = completion;
  slot_ = status::Recorder::process().add_group(name, group_rank, group_size, status::Writers::Many);
}

BackendRecord::~BackendRecord() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

void BackendRecord::watch(std::uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) {
    slot_.complete(seq);
    return;
  }
  if (completion_ == Completion::Future) {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const std::exception&) {
      // a Work without a future ("not implemented"): polled below
    }
    if (future) {
      status::SlotWriter slot = slot_;
      // Runs on the thread that completes the op (gloo's), or here when it is complete already.
      future->addCallback([slot, seq](c10::ivalue::Future&) mutable { slot.complete(seq); });
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  inflight_.emplace_back(seq, work);
  if (!poller_.joinable()) poller_ = std::thread([this] { poll_loop(); });
  cv_.notify_one();
}

// Every 20 ms: the ops whose Work completed leave the record (in any order; the slot keeps the
// newest entered as the current one, status/recorder.hpp).
void BackendRecord::poll_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (inflight_.empty()) {
      cv_.wait(lock, [this] { return stopping_ || !inflight_.empty(); });
      continue;
    }
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      bool done = true;
      try {
        done = it->second->isCompleted();
      } catch (const std::exception&) {
        // a failed op is complete
      }
      if (done) {
        slot_.complete(it->first);
        it = inflight_.erase(it);
      } else {
        ++it;
      }
    }
    cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return stopping_; });
  }
}

}  // namespace lspawn
