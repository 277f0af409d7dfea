// HangWatch: the launcher's watchdog over its ranks' status records (docs/hang-diagnosis.md).
//
// The caller drives it from its poll loop (no thread): poll() at next_deadline() or sooner.
// Each poll maps the records that appeared (`<dir>/rank-<R>.status`) and compares their
// versions with the previous poll. A hang is: at least one rank inside a collective, and no
// record changed for `timeout`. Then (or on request_report()) it analyses the records
// (launcher/hang_report.hpp), asks the lagging ranks for their main-thread stacks
// (status/stack_dump.hpp: the signal goes only to a pid the supervisor started for that rank
// and whose record announces the handler), waits up to `stack_wait` for the stack files while
// the caller's loop goes on, and prints one report.
//
// Ranks on other nodes: the report logic takes RankInputs; a multi-node version adds the records
// of remote ranks (fetched through the store or the launchers' control channel) to
// collect_inputs() before the analysis.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/hang_report.hpp"
#include "launcher/supervisor.hpp"
#include "status/reader.hpp"

namespace lspawn {

// The signal that asks lspawn for the report while the job runs (`kill -URG <lspawn pid>`): never
// forwarded to the workers, never stopping. SIGURG because nothing sends it to lspawn otherwise
// (the kernel only for sockets given F_SETOWN; not terminals, shells, Slurm or systemd) and its
// default action is to be ignored, so a stray one to any other process is harmless.
inline constexpr int kReportSignal = SIGURG;

struct HangWatchOptions {
  std::string dir;                          // the status directory (LSPAWN_STATUS_DIR of the ranks)
  std::chrono::milliseconds timeout{0};     // no progress for this long → hang; 0: on request only
  std::chrono::milliseconds stack_wait{1500};  // how long to wait for the lagging ranks' stacks
  std::function<void(const std::string&)> print;  // the report (several lines, each "lspawn: ...")
  std::string timeout_flag = "--hang-timeout";     // named in the headline
};

class HangWatch {
 public:
  explicit HangWatch(HangWatchOptions opts);

  // When poll() wants to run next.
  Clock::time_point next_deadline() const;
  // Reads the records; starts or finishes a report. `workers`: the supervisor's results (pid,
  // exit) by rank. Returns true once, when a hang report was printed (the caller stops the job).
  bool poll(Clock::time_point now, const std::vector<WorkerResult>& workers);
  // A report on demand (the job goes on): started at the next poll().
  void request_report() { requested_ = true; }
  bool fired() const { return fired_; }

  // The inputs of a report for this node's ranks (records as read now, no stacks).
  std::vector<RankInput> collect_inputs(const std::vector<WorkerResult>& workers);

 private:
  // Maps the records of `workers` that appeared since the last call.
  void open_records(const std::vector<WorkerResult>& workers);
  void start_report(Clock::time_point now, bool hang, const std::vector<WorkerResult>& workers);
  void finish_report();
  bool stacks_ready() const;

  HangWatchOptions opts_;
  std::map<int, status::RecordReader> readers_;
  std::map<int, std::string> problems_;
  std::uint64_t last_signature_ = 0;
  Clock::time_point last_progress_;
  std::int64_t started_us_ = 0;
  bool requested_ = false;
  bool fired_ = false;
  // A report being collected.
  struct Pending {
    bool hang = false;
    Clock::time_point deadline;
    std::vector<RankInput> inputs;
    HangAnalysis analysis;
    std::vector<int> asked;  // ranks sent the stack signal
    std::int64_t now_us = 0;
    double quiet_s = 0;
  };
  std::optional<Pending> pending_;
};

}  // namespace lspawn
