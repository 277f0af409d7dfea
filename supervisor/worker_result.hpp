// WorkerResult: what happened to one worker (pid, exit code or signal, its error report, root
// cause), as the Supervisor (supervisor/supervisor.hpp) records it and as spawn()'s
// ProcessContext::workers() hands it to the caller. Plain data: the Supervisor's own machinery
// is not needed to read one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "proto/messages.hpp"

namespace lspawn {

enum class WorkerState { Running, Stopping, Draining, Done };
const char* worker_state_name(WorkerState s);

// What happened to one worker. Valid fields grow as the worker advances.
struct WorkerResult {
  int rank = -1;
  pid_t pid = -1;
  WorkerState state = WorkerState::Running;
  bool exited = false;  // wait status known
  int wait_status = 0;  // raw status (WIFEXITED/WIFSIGNALED) once exited
  int exit_code = 0;    // WEXITSTATUS when it exited normally
  int term_signal = 0;  // terminating signal, 0 when it exited normally
  bool root_cause = false;
  int stop_signal_sent = 0;                  // last signal lspawn sent to stop it (SIGTERM, SIGINT, SIGKILL…), 0 none
  std::string exec_error;                    // "cannot execute '/x': No such file or directory" if exec failed
  std::optional<proto::ErrorReport> report;  // from its error file, when it failed and wrote one
  std::string report_problem;                // an error file that existed but could not be read
  std::string error_file;
  double seconds = 0;        // start to exit
  int64_t exit_time_us = 0;  // wall clock (µs since the epoch) when its exit was seen

  // When it failed (wall clock, µs): its report's failed_at_us when set, else exit_time_us.
  int64_t failure_time_us() const;
  // It wrote an error report and was then stopped by lspawn while still exiting.
  bool reported_then_stopped() const { return report && killed_by_supervisor(); }

  bool failed() const { return exited && (term_signal != 0 || exit_code != 0); }
  // Died of a signal lspawn sent it (not a root cause, not its own failure).
  bool killed_by_supervisor() const;
  // "process 1 terminated with exit code 3" (torch.multiprocessing wording).
  std::string describe() const;
};

}  // namespace lspawn
