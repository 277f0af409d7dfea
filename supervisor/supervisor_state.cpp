#include "supervisor/supervisor_state.hpp"

namespace lspawn {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Running: return "Running";
    case Phase::Stopping: return "Stopping";
    case Phase::Killing: return "Killing";
    case Phase::Finished: return "Finished";
  }
  return "?";
}

const char* phase_event_name(PhaseEvent e) {
  switch (e) {
    case PhaseEvent::Start: return "Start";
    case PhaseEvent::Stop: return "Stop";
    case PhaseEvent::Kill: return "Kill";
    case PhaseEvent::AllDone: return "AllDone";
  }
  return "?";
}

std::optional<Phase> next_phase(Phase p, PhaseEvent e) {
  switch (e) {
    case PhaseEvent::Start:
      if (p == Phase::Finished) return Phase::Running;
      return std::nullopt;
    case PhaseEvent::Stop:
      if (p == Phase::Running || p == Phase::Finished) return Phase::Stopping;
      return std::nullopt;
    case PhaseEvent::Kill:
      if (p == Phase::Running || p == Phase::Stopping) return Phase::Killing;
      return std::nullopt;
    case PhaseEvent::AllDone:
      if (p != Phase::Finished) return Phase::Finished;
      return std::nullopt;
  }
  return std::nullopt;
}

const char* worker_state_name(WorkerState s) {
  switch (s) {
    case WorkerState::Running: return "Running";
    case WorkerState::Stopping: return "Stopping";
    case WorkerState::Draining: return "Draining";
    case WorkerState::Done: return "Done";
  }
  return "?";
}

const char* worker_event_name(WorkerEvent e) {
  switch (e) {
    case WorkerEvent::Signal: return "Signal";
    case WorkerEvent::Exit: return "Exit";
    case WorkerEvent::Drained: return "Drained";
  }
  return "?";
}

std::optional<WorkerState> next_worker_state(WorkerState s, WorkerEvent e) {
  switch (e) {
    case WorkerEvent::Signal:
      if (s == WorkerState::Running) return WorkerState::Stopping;
      return std::nullopt;
    case WorkerEvent::Exit:
      if (s == WorkerState::Running || s == WorkerState::Stopping) return WorkerState::Draining;
      return std::nullopt;
    case WorkerEvent::Drained:
      if (s == WorkerState::Draining) return WorkerState::Done;
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace lspawn
