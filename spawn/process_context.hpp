// ProcessContext: the workers of one spawn() call, as the caller sees them.
//
// spawn() returns it (already joined when SpawnOptions::join). It owns the launcher's
// Supervisor for the call (the same state machine, failure handling and reports as the lspawn
// CLI), the run directory (error reports, results), the reserved MASTER_PORT and, for
// StartMethod::Forkserver, its lease on the server.
//
// Guarantees:
//   - join(timeout) waits at most `timeout`; it returns false while workers still run, true once
//     every worker has exited 0 (and keeps returning true). When a worker fails, join() stops
//     the others (SIGTERM to their process groups, SIGKILL after the grace period), waits until
//     every one is gone, and throws ProcessRaisedException / ProcessExitedException for the
//     first failure (the root cause); it throws the same again if called again.
//   - terminate() stops every worker the same way and waits until all are gone.
//   - destroying an unfinished context (or move-assigning over it) terminates its workers
//     (daemon) or joins them (!daemon).
// Thread-safety: none; use it from the thread that called spawn() (the supervisor's poll loop
// runs inside join()).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spawn/codec.hpp"
#include "spawn/options.hpp"
#include "supervisor/worker_result.hpp"
#include "proto/messages.hpp"

namespace lspawn {

// What spawn() hands to the non-template machinery: the function in both of its forms.
struct SpawnPlan {
  int nprocs = 1;
  // Name under which the function is registered (LSPAWN_REGISTER); empty when it is not
  // (lambdas, unregistered functions): only StartMethod::Fork can run it then.
  std::string function;
  // Encoded arguments, for the start methods that hand the call to another program image.
  // Filled lazily by encode_args (not needed under Fork).
  std::function<proto::ValueList()> encode_args;
  // Runs the function in a forked child (StartMethod::Fork) and returns its encoded result.
  std::function<std::optional<proto::Value>(int index)> run_in_child;
  // The arguments, kept alive by the ProcessContext until every worker has finished (what
  // they reference, e.g. a ModelWrapper's snapshot file, must outlive the workers' start).
  std::shared_ptr<void> arguments;
};

class ProcessContext {
 public:
  // Starts the workers. Throws SpawnError (nothing left running) when they cannot start.
  ProcessContext(const SpawnPlan& plan, const SpawnOptions& opts);
  ProcessContext(ProcessContext&&) noexcept;
  ProcessContext& operator=(ProcessContext&&) noexcept;
  ~ProcessContext();

  // Worker pids by index.
  const std::vector<pid_t>& pids() const;
  int nprocs() const { return static_cast<int>(pids().size()); }

  // See the class comment. nullopt: wait as long as it takes.
  bool join(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Stops every worker (SIGTERM, grace period, SIGKILL) and waits until all are gone.
  void terminate();
  // True once every worker has exited (successfully or not).
  bool finished() const;

  // The value each worker's function returned, decoded as R, by index: nullopt for ranks
  // whose result was not requested (SpawnOptions::results). Valid once join() returned true.
  // Throws CodecError if R is not what the function returned; SpawnError before a success.
  template <class R>
  std::vector<std::optional<R>> results() const {
    std::vector<std::optional<R>> out;
    for (const auto& v : raw_results()) {
      out.push_back(v ? std::optional<R>(Codec<R>::decode(*v)) : std::nullopt);
    }
    return out;
  }
  // Same, undecoded.
  const std::vector<std::optional<proto::Value>>& raw_results() const;

  // What happened to each worker (pid, exit code or signal, error report, root cause), from
  // the Supervisor, in index order. Empty for a call that ran in-process (nprocs == 1).
  const std::vector<WorkerResult>& workers() const;

  // A context with no child: spawn() with nprocs == 1 ran the function in the calling process
  // and got these results. pids() is empty; join() returns true.
  static ProcessContext in_process(std::vector<std::optional<proto::Value>> results) {
    return ProcessContext(std::move(results));
  }

 private:
  explicit ProcessContext(std::vector<std::optional<proto::Value>> local_results);
  // What the destructor does (terminate when daemon, else join), errors swallowed.
  void release() noexcept;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lspawn
