// Supervisor: starts workers, pumps their output, reaps them, and stops the rest when one fails.
//
// One thread, one poll loop. Everything is an fd event of that loop: a worker's exit (a pidfd
// per child, or notify_exit() for a child someone else reaps), its stdout/stderr pipes, the
// signals it forwards (signalfd), the caller's own fds (watch_fd), and deadlines (the grace
// period, the caller's step deadline). No threads, no sleeps, no polling intervals.
//
// State machine (docs/supervisor.md has the full table):
//   worker:     Running ──exit──► Draining ──both pipes EOF──► Done
//                  │ stop signal sent
//                  ▼
//               Stopping ──exit──► Draining
//   supervisor: Running ──first failure / stop signal / terminate()──► Stopping
//               Stopping ──grace period over / second SIGINT / kill_now()──► Killing (SIGKILL)
//               any ──every worker Done──► Finished
// A worker that exits non-zero or by a signal while the supervisor is Running is the root
// cause (the first one only, when fail_fast); every other worker's process group then gets
// SIGTERM (or the received signal), SIGKILL after grace_period. A worker that exits 0 early
// is fine. After a worker's exit, whatever is left of its process group (its own children) is
// SIGKILLed, so nothing outlives the run; a Guardian does the same if the supervisor's
// process dies.
//
// Each child: its own process group (pgid = pid), PR_SET_PDEATHSIG(SIGKILL) (checked against
// a parent that died before it was set), the signal mask of the thread that built the
// Supervisor, stdin from /dev/null, stdout/stderr to pipes read by the supervisor.
//
// Ownership: the Supervisor owns its children until they are reaped; destroying it before
// finished() SIGKILLs their process groups and reaps them. Sinks are borrowed.
// Thread-safety: none; use from the thread that constructed it (the forwarded signals are
// blocked in that thread only — block them in every thread if the process has others).
#pragma once

#include <chrono>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "placement/cpu_list.hpp"
#include "supervisor/guardian.hpp"
#include "supervisor/output.hpp"
#include "sys/sys.hpp"
#include "supervisor/supervisor_state.hpp"
#include "supervisor/worker_result.hpp"
#include "proto/messages.hpp"

namespace lspawn {

using Clock = std::chrono::steady_clock;

struct SupervisorOptions {
  // Time between the stop signal (SIGTERM or the forwarded one) and SIGKILL. 0: SIGKILL at once.
  std::chrono::milliseconds grace_period{5000};
  // Signals caught (via signalfd; blocked in the constructing thread) and forwarded to every
  // worker's process group. Of these, SIGUSR1/SIGUSR2 are only forwarded; any other one also
  // stops the run (grace period, then SIGKILL) and is reported by stop_signal(). A second
  // SIGINT while stopping sends SIGKILL at once. Empty (default): signals are left alone.
  std::vector<int> forward_signals;
  // Signals caught like forward_signals but neither forwarded nor stopping: on_report_signal(sig)
  // runs in step() (lspawn's on-demand hang report, docs/hang-diagnosis.md).
  std::vector<int> report_signals;
  std::function<void(int sig)> on_report_signal;
  // Stop every other worker when the first one fails. false: let the others run to the end.
  bool fail_fast = true;
  // Where output goes; borrowed, must outlive the Supervisor. Empty: output is read and dropped.
  std::vector<OutputSink*> sinks;
  // Where a failed worker's output went when it is not on the console (its log files, say), for
  // the failure report: one line, or "" for nothing to add. Null: nothing.
  std::function<std::string(int rank)> output_note;
  // A worker that exited but whose pipes stay open this long (a grandchild that left its
  // process group holds them) has its pipes closed; what is still unread is lost.
  std::chrono::milliseconds drain_timeout{2000};
  // Informational lines ("process 1 terminated with exit code 3; stopping 3 workers ..."),
  // without a trailing newline. Null: none.
  std::function<void(const std::string&)> on_info;
  // The run's private directory (absolute), removed by the Guardian if this process dies before
  // it does so itself (SIGKILL, the OOM killer): a killed lspawn leaves no directory behind.
  // Empty: none. The caller still removes it on every other way out.
  std::string run_dir;
  // Used in reports and summaries.
  std::string host;    // default: gethostname()
  int world_size = 0;  // "rank R of W" in the summary; 0: the number of workers started
};

// How a worker is started by exec. Build `env` with env::worker_environment(). Only fds 0-2
// cross the exec (every other fd is marked close-on-exec in the child, as Python's subprocess
// does by default).
struct ExecSpec {
  std::string path;               // executable to execve (resolve with sys::find_executable)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // full environment, "NAME=value"
  std::string error_file;         // read when the worker fails; may be empty
  placement::CpuList cpus;        // its CPUs (--numa-binding), set in the child before the exec;
                                  // empty: the supervisor's own
};

// How a worker is started by fork without exec (spawn()'s Fork method). In the child, after
// the standard setup, `fn` runs; its return value (& 0xff) is the exit code; an uncaught
// exception writes an ErrorReport to error_file (when set) and exits 1. The child never
// returns into the caller's code: it ends with _exit after flushing stdio. Before fn runs, the
// child closes the supervisor's fds (owned_fds()) and resets caught signals to SIG_DFL, as
// an exec would (ignored signals stay ignored); fn may install its own handlers.
struct ForkSpec {
  std::function<int()> fn;
  std::string error_file;
  int local_rank = -1;  // recorded in the ErrorReport
};

class Supervisor {
 public:
  // Forks the Guardian and sets up signal forwarding. Throws sys::SysError.
  explicit Supervisor(SupervisorOptions opts);
  // Not finished: SIGKILLs every remaining worker group and reaps. Restores the signal mask.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts a worker by fork + execve. Returns its pid. The exec outcome is known when this
  // returns: an exec failure (reported by the child over a close-on-exec pipe) makes the
  // worker a failed one with exec_error set and exit code 127 (126 for EACCES and similar).
  // `rank` must be unique among this supervisor's workers. Throws sys::SysError (fork, pipe).
  pid_t start_exec(int rank, const ExecSpec& spec);
  // Starts a worker by fork, running spec.fn in the child (see ForkSpec).
  pid_t start_fork(int rank, ForkSpec spec);
  // Supervises a process this supervisor did not start (a forkserver's child): its output
  // comes on out/err (read ends, taken over), its process group `pgid` (0: none of its own)
  // is signalled to stop it, and its exit MUST be reported with notify_exit().
  void adopt(int rank, pid_t pid, pid_t pgid, sys::Fd out, sys::Fd err, std::string error_file);
  // Reports the exit of an adopted worker (`wait_status` as from waitpid). Processed at once.
  void notify_exit(int rank, int wait_status);

  // Adds the caller's fd to the loop: cb(revents) runs inside step() when poll reports it.
  // The fd stays owned by the caller; unwatch_fd() before closing it.
  void watch_fd(int fd, short events, std::function<void(short revents)> cb);
  void unwatch_fd(int fd);

  // One iteration of the loop: waits for events no later than `deadline`, handles them.
  // Returns finished(). Call repeatedly; harmless once finished.
  bool step(Clock::time_point deadline);
  // Steps until finished() or `deadline`; returns finished(). Callable repeatedly (join(timeout)).
  bool run_until(Clock::time_point deadline);
  // Steps until finished().
  void run();

  // Starts stopping every worker: `sig` to each process group, SIGKILL after the grace period.
  // Recorded as stop_signal(). No-op once stopping. `reason` ("the hang watchdog") replaces the
  // signal in the summary's "stopped by ..." line.
  void terminate(int sig = SIGTERM, std::string reason = {});
  // SIGKILL to every worker group now.
  void kill_now();
  // Starts stopping every worker like terminate(), but on behalf of someone else (the other
  // nodes of a multi-node job): nothing is recorded as stop_signal(), and the workers it stops
  // are "terminated by lspawn", not root causes. No-op once stopping.
  void stop_workers(int sig = SIGTERM);
  // After finished(): forgets every worker, result, root cause and stop signal, so that the
  // next round of a restarted job starts on this same supervisor (its signal forwarding,
  // guardian and watched fds stay). world_size > 0: the next round's (an elastic job's
  // changes), for "rank R of W". Throws std::logic_error while not finished().
  void new_round(int world_size = 0);
  // The signalfd of the forwarded signals (-1 when none). While finished(), step() does not
  // poll it: a caller that waits between rounds polls it and calls take_signals().
  int signal_fd() const { return signal_fd_.get(); }
  // Reads the pending forwarded signals without acting on them (between rounds).
  std::vector<int> take_signals();

  bool finished() const { return phase_ == Phase::Finished; }
  Phase phase() const { return phase_; }
  // The stopping signal received (or given to terminate()), 0 if none.
  int stop_signal() const { return stop_signal_; }
  // Results in start order.
  const std::vector<WorkerResult>& results() const { return results_; }
  const WorkerResult& result(int rank) const;
  // Rank of the root cause, if any worker failed while the run was not stopping.
  // Provisional while running (the first failure seen, which triggered fail-fast); once
  // finished(), the failure that came first by failure_time_us() (docs/error-reports.md).
  std::optional<int> root_cause() const { return root_cause_; }
  // 0 when every worker exited 0; the root cause's exit code (128+N for signal N); else
  // 128+stop_signal() when stopped by a signal; 1 when workers failed otherwise.
  int exit_code() const;
  // The failure summary (root cause first), each line prefixed "lspawn: ". Empty on success.
  // include_root_cause false: without the root cause's block (a multi-node job prints the
  // job's root cause, which may come from another node, itself).
  std::string summary(bool include_root_cause = true) const;
  // The root cause's block of summary() ("lspawn: root cause: process 3 terminated ..." and
  // its detail lines); empty when there is no root cause.
  std::string root_cause_report() const;
  // The earliest failure of a worker of its own (by failure_time_us()), whatever the phase:
  // also one that failed or reported an error while being stopped on behalf of other nodes
  // (stop_workers()), which is never this supervisor's root_cause(). A multi-node job compares
  // it with the other nodes' (docs/multi-node.md). nullopt when none failed on its own.
  std::optional<int> earliest_failure() const;
  // The block of summary() for `rank` as if it were the root cause.
  std::string failure_report(int rank) const;
  // The exit status lspawn gives for this worker's failure (see exit_code()).
  static int failure_exit_code(const WorkerResult& r);

  // Every fd the supervisor owns (pipes, pidfds, signalfd, guardian). A forked child that
  // does not exec closes these.
  std::vector<int> owned_fds() const;

 private:
  struct Worker;
  Worker& worker(int rank);
  pid_t fork_child(int rank, const std::function<void()>& in_child, sys::Pipe& out, sys::Pipe& err);
  Worker& add_worker(int rank, pid_t pid, pid_t pgid, sys::Fd out, sys::Fd err, std::string error_file);
  void on_signal(int sig);
  void on_exit(Worker& w, int status);
  void on_readable(Worker& w, int stream);
  void close_stream(Worker& w, int stream);
  void drain(Worker& w);
  void begin_stop(int sig);
  void signal_running(int sig);
  // The one writer of phase_ and of each worker's state (supervisor_state.hpp's tables); false:
  // the table says "-" and nothing changed.
  bool enter(PhaseEvent e);
  static bool move(WorkerResult& r, WorkerEvent e);
  void advance();
  // At the end of the run: moves root_cause_ to the earliest failure (see root_cause()).
  void settle_root_cause();
  void info(const std::string& line);
  void detail(std::ostream& os, const WorkerResult& r, const char* head) const;
  void guard(pid_t pgid);  // registers with the guardian; a dead guardian is reported, not fatal

  SupervisorOptions opts_;
  Guardian guardian_;
  sys::Fd signal_fd_;
  sys::Fd devnull_;
  sigset_t saved_mask_;
  bool mask_changed_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<WorkerResult> results_;
  std::map<int, size_t> by_rank_;
  struct Watch {
    int fd;
    short events;
    std::function<void(short)> cb;
  };
  std::vector<Watch> watches_;
  Phase phase_ = Phase::Finished;  // Running once a worker is added; changed by enter() only
  int stop_signal_ = 0;
  std::string stop_reason_;
  std::optional<int> root_cause_;
  Clock::time_point stop_deadline_{};
};

}  // namespace lspawn
