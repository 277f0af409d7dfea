// How far a rank got in its start, for the restart policy (docs/cli.md, "Restarts"): a worker
// that fails before it reached its rendezvous (an ImportError, a SyntaxError, a bad argument)
// fails the same way in the next attempt, so lspawn does not restart it.
//
// Two marker files in the ranks' status directory (LSPAWN_STATUS_DIR, status/layout.hpp), each
// holding the pid that wrote it, in decimal:
//   rank-<R>.started     the worker's lspawn code runs: lspawn_runtime loaded (a C++ worker), or
//                        the Python workers' sitecustomize (python/lspawn_hang.py, which writes
//                        the same files);
//   rank-<R>.rendezvous  it entered its rendezvous (init_process_group).
// A worker that writes neither (a program that links no lspawn code, a Python worker with the
// sitecustomize off, one forked by a forkserver before it got to its rendezvous) is Unknown: its
// failures are restarted as before. The pid ties a marker to one process: an older attempt's, or
// a child's that inherited RANK, does not count.
#pragma once

#include <string>

namespace lspawn::status {

// Writes `<LSPAWN_STATUS_DIR>/rank-<RANK>.<phase>` with this process's pid (atomically: a
// temporary file renamed). Does nothing outside lspawn (either variable unset or bad), and
// nothing when it cannot write (a marker is a hint, never a failure).
void mark_phase(const char* phase);

enum class StartPhase {
  Unknown,           // no marker of this process: it cannot tell
  BeforeRendezvous,  // started, never entered its rendezvous
  Rendezvous,        // entered its rendezvous
};

// Where process `pid`, rank `rank`, got to, from the markers in `dir`.
StartPhase start_phase(const std::string& dir, int rank, int pid);

}  // namespace lspawn::status
