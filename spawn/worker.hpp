// The child side of spawn(): what runs inside a worker process, whatever started it.
//
// run_worker() calls the worker's function, then stores its result (a SpawnResult frame, in the
// file the parent named) or, when the function throws, an ErrorReport (JSON, in the file named
// by TORCHELASTIC_ERROR_FILE) plus a one-line summary on stderr. It returns the exit status the
// process must exit with: 0 on success, 1 after an exception (as torch.multiprocessing does).
// A SIGTERM that lands while the exception unwinds waits until the report is written
// (supervisor/worker_failure.hpp): the worker that failed first stays the root cause.
// It never calls exit(); the caller (the forked child, the forkserver's child, or init() in an
// exec'd child) exits with the returned status after flushing stdio.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "proto/messages.hpp"

namespace lspawn {

struct WorkerBody {
  int index = 0;            // process index (rank) of this worker
  int nprocs = 1;           // number of workers in the spawn() call
  std::string result_path;  // where to write the SpawnResult; "" = the result is not wanted
  std::string error_file;   // where to write the ErrorReport; "" = stderr only
  // Runs the user's function; returns its encoded result, nullopt for void functions.
  std::function<std::optional<proto::Value>()> call;
};

// Runs body.call() as described above. Returns the exit status (0 or 1). Never throws.
int run_worker(const WorkerBody& body) noexcept;

// Writes `msg` as one frame into `path` atomically (temp file + rename): a reader never sees a
// partial result. Throws wire::WireError naming the path and the syscall.
// (SpawnCall: the call of an exec'd child; SpawnResult: what a child returns.)
void write_frame_file(const std::string& path, const proto::SpawnCall& msg);
void write_frame_file(const std::string& path, const proto::SpawnResult& msg);

// Reads one frame from `path`, bounded by max_bytes. Throws wire::WireError.
void read_frame_file(const std::string& path, proto::SpawnCall& msg, uint32_t max_bytes);
void read_frame_file(const std::string& path, proto::SpawnResult& msg, uint32_t max_bytes);

// Builds the ErrorReport of the exception being handled (call from inside a catch block):
// demangled type, what(), pid, host, time. rank/local_rank are `index`.
proto::ErrorReport report_current_exception(int index);

}  // namespace lspawn
