// The Supervisor's two state machines (supervisor.hpp), as tables in code: the run's phase and
// each worker's state. Pure: the Supervisor feeds them events and does what docs/supervisor.md
// says each move does (signals, deadlines, the root cause); these say only which moves exist.
// Supervisor::enter() and Supervisor::move() are the one writer of each
// (tests/supervisor/supervisor_state_test.cpp).
//
// The run's phase:
//                 Start      Stop       Kill       AllDone
//   Running       -          Stopping   Killing    Finished
//   Stopping      -          -          Killing    Finished
//   Killing       -          -          -          Finished
//   Finished      Running    Stopping   -          -
//
// Start: a worker was added to a run with no worker left (a new round, or the first worker).
// Stop: a stop began: the first failure under fail_fast, a stop signal received, terminate(),
// stop_workers() (another node failed); from Finished, a worker added while the run was already
// stopping. Kill: the grace period is over, a second SIGINT, kill_now(). AllDone: every worker
// is Done (the root cause is settled as it happens).
//
// Each worker's state:
//                 Signal     Exit       Drained
//   Running       Stopping   Draining   -
//   Stopping      -          Draining   -
//   Draining      -          -          Done
//   Done          -          -          -
//
// Signal: lspawn sent it a stop signal (SIGTERM, the forwarded one, SIGKILL; not SIGUSR1/2 or
// SIGCONT). Exit: its exit was seen (its group's leftovers are killed, its pipes drained).
// Drained: both output pipes reached EOF (or the drain timeout closed them).
// (-: the event changes nothing; the Supervisor does not act on it.)
#pragma once

#include <optional>

#include "supervisor/worker_result.hpp"

namespace lspawn {

enum class Phase { Running, Stopping, Killing, Finished };
const char* phase_name(Phase p);

enum class PhaseEvent { Start, Stop, Kill, AllDone };
const char* phase_event_name(PhaseEvent e);

// The phase after `e` in `p`, or nullopt where the table says "-".
std::optional<Phase> next_phase(Phase p, PhaseEvent e);

enum class WorkerEvent { Signal, Exit, Drained };
const char* worker_event_name(WorkerEvent e);

// The worker's state after `e` in `s`, or nullopt where the table says "-".
std::optional<WorkerState> next_worker_state(WorkerState s, WorkerEvent e);

}  // namespace lspawn
