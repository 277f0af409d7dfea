// The Supervisor's state tables (supervisor/supervisor_state.hpp), cell by cell against the table
// in its comment; the Supervisor's behaviour under them is supervisor_test.cpp's.
#include <catch2/catch.hpp>

#include <optional>

#include "supervisor/supervisor_state.hpp"

using lspawn::next_phase;
using lspawn::next_worker_state;
using lspawn::Phase;
using lspawn::PhaseEvent;
using lspawn::WorkerEvent;
using lspawn::WorkerState;

TEST_CASE("supervisor state: the run's phase table, every cell", "[supervisor_state]") {
  const std::optional<Phase> none;
  struct Row {
    Phase from;
    std::optional<Phase> start, stop, kill, all_done;
  };
  const Row rows[] = {
      {Phase::Running, none, Phase::Stopping, Phase::Killing, Phase::Finished},
      {Phase::Stopping, none, none, Phase::Killing, Phase::Finished},
      {Phase::Killing, none, none, none, Phase::Finished},
      {Phase::Finished, Phase::Running, Phase::Stopping, none, none},
  };
  for (const Row& r : rows) {
    INFO("from " << lspawn::phase_name(r.from));
    CHECK(next_phase(r.from, PhaseEvent::Start) == r.start);
    CHECK(next_phase(r.from, PhaseEvent::Stop) == r.stop);
    CHECK(next_phase(r.from, PhaseEvent::Kill) == r.kill);
    CHECK(next_phase(r.from, PhaseEvent::AllDone) == r.all_done);
  }
}

TEST_CASE("supervisor state: a worker's state table, every cell", "[supervisor_state]") {
  const std::optional<WorkerState> none;
  struct Row {
    WorkerState from;
    std::optional<WorkerState> signal, exit, drained;
  };
  const Row rows[] = {
      {WorkerState::Running, WorkerState::Stopping, WorkerState::Draining, none},
      {WorkerState::Stopping, none, WorkerState::Draining, none},
      {WorkerState::Draining, none, none, WorkerState::Done},
      {WorkerState::Done, none, none, none},
  };
  for (const Row& r : rows) {
    INFO("from " << lspawn::worker_state_name(r.from));
    CHECK(next_worker_state(r.from, WorkerEvent::Signal) == r.signal);
    CHECK(next_worker_state(r.from, WorkerEvent::Exit) == r.exit);
    CHECK(next_worker_state(r.from, WorkerEvent::Drained) == r.drained);
  }
}

TEST_CASE("supervisor state: names for reports", "[supervisor_state]") {
  CHECK(std::string(lspawn::phase_name(Phase::Killing)) == "Killing");
  CHECK(std::string(lspawn::phase_event_name(PhaseEvent::AllDone)) == "AllDone");
  CHECK(std::string(lspawn::worker_state_name(WorkerState::Draining)) == "Draining");
  CHECK(std::string(lspawn::worker_event_name(WorkerEvent::Drained)) == "Drained");
}
