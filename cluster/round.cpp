#include "cluster/round.hpp"

#include <algorithm>
#include <string>

namespace lspawn::node {

const char* round_state_name(RoundState s) {
  switch (s) {
    case RoundState::Running: return "Running";
    case RoundState::Stopping: return "Stopping";
    case RoundState::Restarting: return "Restarting";
    case RoundState::Finished: return "Finished";
  }
  return "?";
}

std::optional<RoundState> next_round_state(RoundState s, RoundEvent e) {
  switch (e) {
    case RoundEvent::Failure:
      if (s == RoundState::Running) return RoundState::Stopping;
      return std::nullopt;
    case RoundEvent::Restart:
      if (s == RoundState::Running || s == RoundState::Stopping) return RoundState::Restarting;
      return std::nullopt;
    case RoundEvent::Start:
    case RoundEvent::Finish:
      if (s == RoundState::Finished) return std::nullopt;
      return e == RoundEvent::Start ? RoundState::Running : RoundState::Finished;
  }
  return std::nullopt;
}

namespace {
// Lower is more fundamental: a lost node explains the failures it caused elsewhere; a round
// stopped to admit a node explains the workers that failed while it stopped.
int kind_order(CauseKind kind) {
  if (kind == CauseKind::NodeLost) return 0;
  if (kind == CauseKind::Signal) return 1;
  if (kind == CauseKind::Membership) return 2;
  return 3;
}

}  // namespace

FinishMsg failed_finish(const Cause& c, int round) {
  FinishMsg f;
  f.restart_count = round;
  f.failed = true;
  f.cause = c;
  f.exit_code = c.exit_code;
  return f;
}

const Cause& root_cause(const std::vector<Cause>& causes) {
  const Cause* best = &causes.front();
  for (const Cause& c : causes) {
    const int a = kind_order(c.kind), b = kind_order(best->kind);
    if (a < b || (a == b && c.time_us < best->time_us)) best = &c;
  }
  return *best;
}

std::string attempt_failed_text(int round, const Cause& c) {
  std::string first = c.text.substr(0, c.text.find('\n'));
  for (const char* p : {"lspawn: ", "root cause: "}) {
    if (first.rfind(p, 0) == 0) first = first.substr(std::string(p).size());
  }
  return "attempt " + std::to_string(round) + " failed (" + first +
         (c.kind == CauseKind::Worker && c.node_rank >= 0 && !c.host.empty()
              ? " on node " + std::to_string(c.node_rank) + " (" + c.host + ")"
              : std::string()) +
         ")";
}

RoundDecision decide_round(const RoundFacts& f) {
  RoundDecision d;
  if (f.causes.empty()) {
    d.finish = FinishMsg{};
    d.finish->restart_count = f.round;
    return d;
  }
  const Cause& best = root_cause(f.causes);
  bool signal = false;
  for (const Cause& c : f.causes) signal = signal || c.kind == CauseKind::Signal;
  if (best.kind == CauseKind::Membership) {
    d.restart = best;
    d.counted = false;
    return d;
  }
  const bool restarts_left = f.restarts_used < f.max_restarts;
  const bool final_code =
      best.kind == CauseKind::Worker &&
      std::find(f.no_restart_codes.begin(), f.no_restart_codes.end(), best.exit_code) != f.no_restart_codes.end();
  const bool before_rendezvous = best.kind == CauseKind::Worker && best.before_rendezvous;
  const bool worker_restart =
      best.kind == CauseKind::Worker && !f.any_lost && restarts_left && !final_code && !before_rendezvous;
  // Elastic: a lost node is a failure like a worker's; the survivors go on if enough are left.
  const bool lost_restartable = f.elastic && best.kind == CauseKind::NodeLost && !signal && restarts_left;
  if (worker_restart || (lost_restartable && f.next_nodes >= f.min_nnodes)) {
    d.restart = best;
    d.survivors = !worker_restart;
    return d;
  }
  d.finish = failed_finish(best, f.round);
  if ((final_code || before_rendezvous) && restarts_left && !f.any_lost) {
    const int left = f.max_restarts - f.restarts_used;
    std::string why;
    if (final_code) {
      std::string codes;
      for (int c : f.no_restart_codes) codes += (codes.empty() ? "" : ",") + std::to_string(c);
      why = "exit code " + std::to_string(best.exit_code) + " is one of --no-restart-exit-codes " + codes;
    } else {
      why = "rank " + std::to_string(best.rank) + " failed before it reached its rendezvous " +
            "(init_process_group): the next attempt would fail the same way";
    }
    d.finish->cause.text +=
        kNotRestartedLine + std::to_string(left) + " restart" + (left == 1 ? "" : "s") + " left): " + why + "\n";
  }
  if (lost_restartable) {
    d.finish->cause.text += "lspawn:   " + std::to_string(f.next_nodes) + " node" + (f.next_nodes == 1 ? "" : "s") +
                            " left, fewer than the " + std::to_string(f.min_nnodes) + " of --nnodes " + f.nnodes_flag +
                            "\n";
  }
  return d;
}

std::optional<Cause> lost_since_decision(const std::vector<Cause>& causes, bool elastic, int next_nodes,
                                         int min_nnodes) {
  for (const Cause& c : causes) {
    if (c.kind == CauseKind::NodeLost && !(elastic && next_nodes >= min_nnodes)) return c;
  }
  return std::nullopt;
}

}  // namespace lspawn::node
