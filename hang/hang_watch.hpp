// HangWatch: the launcher's watchdog over its ranks' status records (docs/hang-diagnosis.md).
//
// The caller drives it from its poll loop (no thread): poll() at next_deadline() or sooner.
// Each poll maps the records that appeared (`<dir>/rank-<R>.status`) and compares their
// versions with the previous poll. A hang is: at least one rank inside a collective, and no
// record changed for `timeout`. Then (or on request_report()) it analyses the records
// (hang/hang_report.hpp), asks the lagging ranks for their main-thread stacks
// (status/stack_dump.hpp: the signal goes only to a pid the supervisor started for that rank
// and whose record announces the handler), waits up to `stack_wait` for the stack files while
// the caller's loop goes on, and prints one report.
//
// A watch that cannot see (--hang-timeout on): once some rank has written its record, a rank
// that has written none max(timeout, 5 s) later is named, once; and when no rank has written
// one after max(timeout, 20 s), the watch says so, once. (Such ranks run neither lspawn's
// runtime nor lspawn_hang: a C++ program without init_process_group(), a Python started with
// -E/-I/-S or LSPAWN_PYTHON_SITE=0; or they have not reached them yet.)
//
// Ranks on other nodes (multi-node jobs): the coordinator's watch also holds the latest records
// of every other node's ranks (set_remote, from their launchers' StatusMsg over the control
// channel): progress and the report span the job, and the stacks of lagging remote ranks are
// asked of their launchers (ask_remote_stacks → the member's ask_stacks_for → add_remote_stacks).
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hang/hang_report.hpp"
#include "supervisor/worker_result.hpp"
#include "sys/sys.hpp"
#include "status/reader.hpp"

namespace lspawn {

// The signal that asks lspawn for the report while the job runs (`kill -URG <lspawn pid>`): never
// forwarded to the workers, never stopping. SIGURG because nothing sends it to lspawn otherwise
// (the kernel only for sockets given F_SETOWN; not terminals, shells, Slurm or systemd) and its
// default action is to be ignored, so a stray one to any other process is harmless.
inline constexpr int kReportSignal = SIGURG;

struct HangWatchOptions {
  std::string dir;                                // the status directory (LSPAWN_STATUS_DIR of the ranks)
  std::chrono::milliseconds timeout{0};           // no progress for this long → hang; 0: on request only
  std::chrono::milliseconds stack_wait{1500};     // how long to wait for the lagging ranks' stacks
  std::function<void(const std::string&)> print;  // the report (several lines, each "lspawn: ...")
  std::string timeout_flag = "--hang-timeout";    // named in the headline
  // Multi-node, coordinator: asks node `node_rank`'s launcher for the stacks of its `ranks`; the
  // answers come back through add_remote_stacks(). Null: remote ranks get no stack.
  std::function<void(int node_rank, const std::vector<int>& ranks)> ask_remote_stacks;
};

class HangWatch {
 public:
  explicit HangWatch(HangWatchOptions opts);

  // When poll() wants to run next: a time after the last poll(), or that poll's time itself
  // (due now: a report was requested), however often the caller wakes in between.
  sys::Clock::time_point next_deadline() const;
  // Reads the records; starts or finishes a report. `workers`: the supervisor's results (pid,
  // exit) by rank. Returns true once, when a hang report was printed (the caller stops the job).
  bool poll(sys::Clock::time_point now, const std::vector<WorkerResult>& workers);
  // A report on demand (the job goes on): started at the next poll().
  void request_report() { requested_ = true; }
  bool fired() const { return fired_; }

  // The inputs of a report for this node's ranks (records as read now, no stacks).
  std::vector<RankInput> collect_inputs(const std::vector<WorkerResult>& workers);

  // Multi-node, coordinator: the latest inputs of node `node_rank`'s ranks (host set, no stacks).
  // They count for progress and are part of every report until clear_remote().
  void set_remote(int node_rank, std::vector<RankInput> inputs);
  void clear_remote() { remote_.clear(); }
  // Multi-node, coordinator: answers to ask_remote_stacks (rank, stack or stack_problem).
  void add_remote_stacks(const std::vector<RankInput>& answers);
  // Multi-node, member: the coordinator asks for the stacks of these ranks of this node. They are
  // asked now; a later poll() calls `answer` with them (or why not), within stack_wait.
  void ask_stacks_for(const std::vector<int>& ranks, const std::vector<WorkerResult>& workers,
                      std::function<void(std::vector<RankInput>)> answer);
  // The last report printed; empty before the first.
  const std::string& last_report() const { return last_report_; }

 private:
  // Maps the records of `workers` that appeared since the last call.
  void open_records(const std::vector<WorkerResult>& workers);
  void start_report(sys::Clock::time_point now, bool hang, const std::vector<WorkerResult>& workers);
  void finish_report();
  bool stacks_ready() const;
  // Sends rank `in` the stack signal (its stack file removed first); false with in.stack_problem
  // set when it cannot be asked.
  bool ask_stack(RankInput& in);
  void finish_stack_job(bool force);
  // The note on ranks without a record (see the top), at most once.
  void note_unseen_ranks(sys::Clock::time_point now, const std::vector<WorkerResult>& workers);

  HangWatchOptions opts_;
  std::map<int, status::RecordReader> readers_;
  std::map<int, std::string> problems_;
  std::uint64_t last_signature_ = 0;
  sys::Clock::time_point last_progress_;
  std::int64_t started_us_ = 0;
  bool requested_ = false;
  bool fired_ = false;
  sys::Clock::time_point last_poll_;                    // the last poll()'s `now` (next_deadline() counts from it)
  sys::Clock::time_point started_;                      // the watch's start: no record at all by started_ + ...
  std::optional<sys::Clock::time_point> first_record_;  // when the first rank's record was seen
  bool unseen_said_ = false;
  // A report being collected.
  struct Pending {
    bool hang = false;
    sys::Clock::time_point deadline;
    std::vector<RankInput> inputs;
    HangAnalysis analysis;
    std::vector<int> asked;         // ranks sent the stack signal
    std::vector<int> remote_asked;  // ranks of other nodes asked through their launchers
    std::int64_t now_us = 0;
    double quiet_s = 0;
  };
  std::optional<Pending> pending_;
  std::map<int, std::vector<RankInput>> remote_;  // by node rank
  std::string last_report_;
  // A member's answer to the coordinator's stack request, being collected.
  struct StackJob {
    std::vector<RankInput> inputs;
    std::vector<int> asked;
    sys::Clock::time_point deadline;
    std::function<void(std::vector<RankInput>)> answer;
  };
  std::optional<StackJob> stack_job_;
};

}  // namespace lspawn
