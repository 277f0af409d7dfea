// SerialExecutor: runs a function in one local worker at a time, like torch_xla's
// MpSerialExecutor (e.g. one dataset download per node while the other workers wait).
//
// Mutual exclusion is an exclusive flock(2) on a lock file shared by the workers of a run:
// by default $LSPAWN_RUN_DIR/serial.lock (set by spawn() and by the lspawn CLI for every
// worker of the run). The kernel drops the lock when its holder dies, whatever kills it, so a
// worker that dies inside run() never blocks the others. Works under every start method and
// across unrelated processes that name the same path.
//
// Not reentrant: run() inside run() on the same path deadlocks (as a non-recursive mutex).
#pragma once

#include <string>
#include <type_traits>
#include <utility>

namespace lspawn {

class SerialExecutor {
 public:
  // Uses $LSPAWN_RUN_DIR/serial.lock. Throws SpawnError when LSPAWN_RUN_DIR is not set (not
  // inside a spawn() or lspawn worker): name a path then.
  SerialExecutor();
  // Uses `lock_path` (created if missing, never removed).
  explicit SerialExecutor(std::string lock_path);

  // Runs fn() while holding the lock; returns what fn returns, rethrows what it throws (the
  // lock is released either way). Blocks until the lock is free.
  template <class Fn>
  auto run(Fn&& fn) -> std::invoke_result_t<Fn&> {
    Hold hold(lock_path_);
    return fn();
  }

  const std::string& lock_path() const { return lock_path_; }

 private:
  // Holds the lock for its lifetime (open + flock(LOCK_EX); close releases it).
  class Hold {
   public:
    explicit Hold(const std::string& path);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    int fd_;
  };
  std::string lock_path_;
};

}  // namespace lspawn
