// SpawnOptions: everything spawn() can be told, with its default.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/output.hpp"

namespace lspawn {

class Forkserver;

// How spawn() starts each worker.
enum class StartMethod {
  // fork() of the calling process: the child inherits everything loaded (LibTorch, a model:
  // copy-on-write) and starts in about a millisecond. Refused (SpawnError) when the caller
  // already runs other threads (LibTorch pools, a process group, ...) unless
  // SpawnOptions::allow_fork_with_threads, which only warns.
  Fork,
  // fork + exec of the same binary (/proc/self/exe, same argv): a fresh process that runs
  // main() until lspawn::init(), which runs the registered function and exits. The function
  // (LSPAWN_REGISTER) and its arguments (lspawn::Codec) travel through proto/ as a SpawnCall.
  // Safe whatever the caller runs; pays the program's start-up cost per worker.
  Spawn,
  // A server forked early (lspawn::init with StartupOptions::start_forkserver, or
  // SpawnOptions::forkserver) forks each worker from its single-threaded state. Safe after
  // LibTorch has started threads; workers start in parallel. Function must be registered.
  Forkserver,
};
const char* start_method_name(StartMethod m);  // "fork" / "spawn" / "forkserver"

// Which workers send their function's return value back to the caller.
enum class ResultFrom {
  All,    // every rank (default)
  Rank0,  // rank 0 only (e.g. the trained state of a DDP run); others' results are discarded
  None,   // nothing travels back
};

struct SpawnOptions {
  // Number of workers. Unset: one per local accelerator (CUDA_VISIBLE_DEVICES if set, else the
  // /dev/nvidiaN devices), 1 on a machine without one. 1: fn(0, args...) runs in the calling
  // process, no child, exceptions propagate unchanged. Must be 1..kMaxProcs: anything else is
  // a SpawnError before anything starts.
  std::optional<int> nprocs;
  static constexpr int kMaxProcs = 4096;

  StartMethod start_method = StartMethod::Spawn;  // torch.multiprocessing's default

  // true: spawn() returns once every worker has finished (it throws on a failure).
  // false: spawn() returns at once; the caller join()s the ProcessContext.
  bool join = true;

  // true: the workers (and their own children) die when the caller dies, whatever kills it
  // (PR_SET_PDEATHSIG + the launcher's guardian), and an unjoined ProcessContext terminates them
  // when destroyed. false: a ProcessContext destroyed unjoined waits for its workers instead,
  // like Python joining non-daemonic processes at exit. lspawn never leaves orphans: a caller
  // killed by a signal takes its workers with it either way.
  bool daemon = true;

  // After the first failure (or terminate()), SIGTERM goes to every other worker's process
  // group, then SIGKILL once this has passed.
  std::chrono::milliseconds grace_period{5000};

  ResultFrom results = ResultFrom::All;
  // Bound on one result read back from a worker (tensors included).
  uint32_t max_result_bytes = 1u << 30;

  // Extra environment for every worker ("NAME" -> "value"), on top of the caller's environment
  // and the env contract (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...), which they cannot override.
  std::map<std::string, std::string> env;
  // MASTER_ADDR given to the workers; MASTER_PORT 0 reserves a free port race-free for the run.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;

  // Worker output. Default (empty sinks): every line to the caller's stdout/stderr prefixed
  // "[rank N] " when prefix_output. Non-empty: these sinks instead (borrowed; they must outlive
  // the ProcessContext).
  bool prefix_output = true;
  std::vector<OutputSink*> sinks;
  // Progress lines ("process 1 terminated with exit code 3; stopping the other workers").
  // Default (null): printed on stderr as "lspawn: <line>". Set to a no-op to silence them.
  std::function<void(const std::string&)> on_info;

  // StartMethod::Forkserver: the server to use (borrowed). Null: the one lspawn::init started,
  // else a new one started now (with a warning when threads already run) for this call.
  lspawn::Forkserver* forkserver = nullptr;

  // StartMethod::Fork in a process that already runs threads: warn instead of refusing.
  bool allow_fork_with_threads = false;

  // Hang watchdog (docs/hang-diagnosis.md), as `lspawn --hang-timeout`: when no worker makes
  // progress in lspawn's collectives for this long (one at least inside one), the hang report
  // goes to on_info (default: stderr), the workers are stopped, and join() throws HangError
  // carrying the report. 0: off (the workers still record; nothing watches).
  std::chrono::milliseconds hang_timeout{0};
};

// Number of local accelerator devices visible to this process, 0 when none (torch-free:
// CUDA_VISIBLE_DEVICES when set, else the /dev/nvidiaN device nodes).
int local_accelerator_count();

}  // namespace lspawn
