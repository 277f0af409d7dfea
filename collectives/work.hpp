// lspawn::Work: the handle an asynchronous collective returns.
//
//   lspawn::Work w = lspawn::all_reduce_async(*group, t);
//   … compute …
//   w.wait();            // t now holds the result; throws CollectiveError on failure
//
// Contract: the caller keeps the group and the tensors alive and untouched until wait() returns,
// and calls wait() before reading the outputs: wait() is where results are finished (copied into
// non-contiguous outputs, divided for Mean, converted back from the transport dtype). A Work
// dropped without wait() leaves its outputs unspecified (the transfer itself still completes).
// Ops that run over shared memory complete inside the *_async call (they are memory-bound; the
// calling thread is the fastest way to move the bytes): their Work is already complete.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "status/recorder.hpp"

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace lspawn {

class Group;

class Work {
 public:
  Work() = default;  // an already complete, successful op

  // Blocks until the op completes, then finishes it. Throws CollectiveError (or a subclass)
  // naming the op, the group and, where known, the ranks that did not take part. Idempotent:
  // later calls return at once, or rethrow the same error.
  void wait();
  // True once wait() would not block.
  bool completed() const;

  // --- construction, by the collectives -------------------------------------------------------
  struct Pending {
    Group* group = nullptr;
    std::string op;
    std::uint64_t sequence = 0;
    std::chrono::steady_clock::time_point start;
    c10::intrusive_ptr<c10d::Work> work;  // null when the transfer already happened
    std::function<void()> finish;         // runs after a successful transfer, once
    status::SlotWriter status;            // told in wait() that op #sequence completed
    bool done = false;
    std::exception_ptr error;
  };
  explicit Work(std::shared_ptr<Pending> pending) : pending_(std::move(pending)) {}

 private:
  std::shared_ptr<Pending> pending_;
};

// Rethrows `error` (from a transport) as a CollectiveError naming op, sequence and group; on a
// timeout or a lost peer it first asks the store which ranks did not reach the op.
[[noreturn]] void throw_collective_error(Group& group, const std::string& op, std::uint64_t sequence,
                                         std::chrono::steady_clock::time_point start, std::exception_ptr error);

}  // namespace lspawn
