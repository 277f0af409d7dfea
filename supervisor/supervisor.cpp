#include "supervisor/supervisor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <typeinfo>

#include <cxxabi.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sys/child_setup.hpp"
#include "sys/duration_text.hpp"
#include "sys/shm_segments.hpp"
#include "supervisor/error_file.hpp"

namespace lspawn {

bool WorkerResult::killed_by_supervisor() const {
  return exited && term_signal != 0 && stop_signal_sent != 0 &&
         (term_signal == stop_signal_sent || term_signal == SIGKILL);
}

int64_t WorkerResult::failure_time_us() const {
  return report && report->failed_at_us > 0 ? report->failed_at_us : exit_time_us;
}

std::string WorkerResult::describe() const {
  if (!exited) return "process " + std::to_string(rank) + " has not exited";
  if (reported_then_stopped()) {
    return "process " + std::to_string(rank) + " raised " +
           (report->exception_type.empty() ? std::string("an exception") : report->exception_type) +
           " and was stopped by lspawn with " + sys::signal_name(term_signal) + " while exiting";
  }
  return "process " + std::to_string(rank) + " " + sys::describe_wait_status(wait_status);
}

// Run-time state of one worker beside its WorkerResult.
struct Supervisor::Worker {
  size_t index = 0;  // into results_
  int rank = -1;
  pid_t pid = -1;
  pid_t pgid = 0;        // 0: no group of its own (adopted without one)
  bool adopted = false;  // exit comes from notify_exit(), not our pidfd
  bool group_registered = false;
  sys::Fd pidfd;
  sys::Fd pipe[2];  // read ends: stdout, stderr
  std::unique_ptr<LineSplitter> split[2];
  Clock::time_point started{};
  Clock::time_point drain_deadline{};
};

namespace {

std::string plural(size_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

std::string demangled_current_exception_type() {
  std::type_info* t = abi::__cxa_current_exception_type();
  if (!t) return "unknown";
  int status = 0;
  char* d = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : t->name();
  std::free(d);
  return out;
}

}  // namespace

Supervisor::Supervisor(SupervisorOptions opts) : opts_(std::move(opts)) {
  if (opts_.host.empty()) opts_.host = sys::hostname();
  if (!opts_.run_dir.empty()) guardian_.remove_on_owner_death(opts_.run_dir);
  sigemptyset(&saved_mask_);
  if (!opts_.forward_signals.empty() || !opts_.report_signals.empty()) {
    sigset_t set;
    sigemptyset(&set);
    for (int s : opts_.forward_signals) sigaddset(&set, s);
    for (int s : opts_.report_signals) sigaddset(&set, s);
    if (::pthread_sigmask(SIG_BLOCK, &set, &saved_mask_) != 0) {
      sys::throw_errno("pthread_sigmask", "blocking forwarded signals");
    }
    mask_changed_ = true;
    int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd < 0) sys::throw_errno("signalfd", "forwarded signals");
    signal_fd_.reset(fd);
  } else {
    ::pthread_sigmask(SIG_SETMASK, nullptr, &saved_mask_);
  }
  int dn = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (dn < 0) sys::throw_errno("open", "/dev/null for worker stdin");
  devnull_.reset(dn);
}

Supervisor::~Supervisor() {
  try {
    for (auto& w : workers_) {
      auto& r = results_[w->index];
      if (r.exited) continue;
      if (w->pgid > 0)
        sys::kill(-w->pgid, SIGKILL, "cleanup");
      else if (w->pid > 0)
        sys::kill(w->pid, SIGKILL, "cleanup");
      if (!w->adopted) {
        int status;
        sys::waitpid(w->pid, &status, 0, "cleanup of rank " + std::to_string(w->rank));
      }
    }
  } catch (...) {}
  guardian_.shutdown();
  // A forwarded signal that came after the last step() read it (Slurm signals lspawn and the
  // workers at once; the workers may exit first) is still pending: restoring the mask would
  // deliver it at its default action and kill the caller (a pre-emption notice at the end of a
  // job made a finished run exit 140). It was for the workers, who are gone: drop it.
  take_signals();
  if (mask_changed_) ::pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
}

void Supervisor::info(const std::string& line) {
  if (opts_.on_info) opts_.on_info(line);
}

void Supervisor::guard(pid_t pgid) {
  try {
    guardian_.register_group(pgid);
  } catch (const sys::SysError& e) {
    // The child exists already and must stay supervised; only the SIGKILL-of-lspawn
    // guarantee is lost for it.
    info(std::string("guardian unavailable, process group ") + std::to_string(pgid) +
         " is not protected against lspawn's death: " + e.what());
  }
}

Supervisor::Worker& Supervisor::worker(int rank) {
  auto it = by_rank_.find(rank);
  if (it == by_rank_.end()) throw std::out_of_range("lspawn: no worker with rank " + std::to_string(rank));
  return *workers_[it->second];
}

const WorkerResult& Supervisor::result(int rank) const {
  auto it = by_rank_.find(rank);
  if (it == by_rank_.end()) throw std::out_of_range("lspawn: no worker with rank " + std::to_string(rank));
  return results_[it->second];
}

std::vector<int> Supervisor::owned_fds() const {
  std::vector<int> fds;
  if (signal_fd_) fds.push_back(signal_fd_.get());
  if (guardian_.write_fd() >= 0) fds.push_back(guardian_.write_fd());
  for (const auto& w : workers_) {
    if (w->pidfd) fds.push_back(w->pidfd.get());
    for (const auto& p : w->pipe)
      if (p) fds.push_back(p.get());
  }
  return fds;
}

Supervisor::Worker& Supervisor::add_worker(int rank, pid_t pid, pid_t pgid, sys::Fd out, sys::Fd err,
                                           std::string error_file) {
  if (by_rank_.count(rank)) {
    throw std::invalid_argument("lspawn: rank " + std::to_string(rank) + " started twice");
  }
  auto w = std::make_unique<Worker>();
  w->index = results_.size();
  w->rank = rank;
  w->pid = pid;
  w->pgid = pgid;
  w->started = Clock::now();
  w->pipe[0] = std::move(out);
  w->pipe[1] = std::move(err);
  for (int s = 0; s < 2; ++s) {
    if (w->pipe[s]) sys::set_nonblocking(w->pipe[s].get(), "output of rank " + std::to_string(rank));
    w->split[s] = std::make_unique<LineSplitter>(rank, static_cast<Stream>(s), opts_.sinks);
  }
  WorkerResult r;
  r.rank = rank;
  r.pid = pid;
  r.error_file = std::move(error_file);
  results_.push_back(std::move(r));
  by_rank_[rank] = workers_.size();
  workers_.push_back(std::move(w));
  Worker& added = *workers_.back();
  if (phase_ == Phase::Finished) {
    // Every earlier worker was done; a run that was already stopping stops this one too.
    if (stop_signal_ || root_cause_) {
      enter(PhaseEvent::Stop);
      stop_deadline_ = Clock::now() + opts_.grace_period;
    } else {
      enter(PhaseEvent::Start);
    }
  }
  if (phase_ == Phase::Stopping || phase_ == Phase::Killing) {
    const int sig =
        phase_ == Phase::Killing || opts_.grace_period.count() <= 0 ? SIGKILL : (stop_signal_ ? stop_signal_ : SIGTERM);
    const pid_t target = added.pgid > 0 ? -added.pgid : added.pid;
    sys::kill(target, sig, "stopping rank " + std::to_string(rank) + ", started while stopping");
    results_.back().stop_signal_sent = sig;
    move(results_.back(), WorkerEvent::Signal);
  }
  return added;
}

pid_t Supervisor::fork_child(int rank, const std::function<void()>& in_child, sys::Pipe& out, sys::Pipe& err) {
  const pid_t parent = ::getpid();
  std::fflush(nullptr);
  // Every signal blocked across fork(): a signal sent to the new child (the supervisor stopping
  // it at once, say) must not run a handler inherited from this process before the child has
  // reset them (found by ThreadSanitizer, where the child is slow enough to lose that race).
  sigset_t all, before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &before);
  pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) sys::throw_errno("fork", "worker rank " + std::to_string(rank));
  if (pid == 0) {
    // Child: only syscalls until in_child().
    sys::child_setup(parent);
    // Signal dispositions as an exec would leave them: handlers inherited from the parent (a
    // test framework's, the application's) are reset; ignored stays ignored. Then the caller's
    // mask, so that pending signals arrive to default dispositions.
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      if (old.sa_handler == SIG_IGN || old.sa_handler == SIG_DFL) continue;
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(sig, &dfl, nullptr);
    }
    ::pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
    ::dup2(devnull_.get(), 0);
    ::dup2(out.write.get(), 1);
    ::dup2(err.write.get(), 2);
    in_child();
    ::_exit(127);
  }
  // Parent: also set the group from here so signals reach it even before the child runs.
  ::setpgid(pid, pid);
  out.write.reset();
  err.write.reset();
  return pid;
}

pid_t Supervisor::start_exec(int rank, const ExecSpec& spec) {
  if (spec.argv.empty()) throw std::invalid_argument("lspawn: start_exec with an empty argv");
  // Everything the child needs is built before fork: it only makes system calls.
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string ctx = "rank " + std::to_string(rank);
  auto out = sys::make_pipe("stdout of " + ctx);
  auto err = sys::make_pipe("stderr of " + ctx);
  auto status_pipe = sys::make_pipe("exec status of " + ctx);
  const char* path = spec.path.c_str();
  const int status_w = status_pipe.write.get();
  // Written by the child (no allocation there) if the kernel refuses its CPUs.
  const std::string affinity_error = "lspawn: " + ctx + ": sched_setaffinity to CPUs " +
                                     placement::cpu_list_text(spec.cpus) + " failed; not started\n";
  pid_t pid = fork_child(
      rank,
      [&] {
        struct sigaction sa {};
        sa.sa_handler = SIG_DFL;
        ::sigaction(SIGPIPE, &sa, nullptr);
        // Only stdin/stdout/stderr cross the exec, whatever the caller's process had open
        // without O_CLOEXEC (like Python's subprocess close_fds=True, which torchrun uses).
        // CLOEXEC rather than close: the status pipe must stay open until execve.
        ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
        if (!spec.cpus.empty() && placement::set_affinity(spec.cpus) != 0) {
          (void)!::write(2, affinity_error.data(), affinity_error.size());
          ::_exit(126);
        }
        sys::execve_or_report(path, argv.data(), envp.data(), status_w);
      },
      out, err);
  status_pipe.write.reset();
  guard(pid);
  const int exec_errno = sys::read_exec_errno(status_pipe.read.get());
  Worker& w = add_worker(rank, pid, pid, std::move(out.read), std::move(err.read), spec.error_file);
  w.group_registered = true;
  w.pidfd = sys::pidfd_open(pid, ctx);
  if (exec_errno != 0) {
    results_[w.index].exec_error = "cannot execute '" + spec.path + "': " + std::strerror(exec_errno);
  }
  return pid;
}

pid_t Supervisor::start_fork(int rank, ForkSpec spec) {
  const std::string ctx = "rank " + std::to_string(rank);
  auto out = sys::make_pipe("stdout of " + ctx);
  auto err = sys::make_pipe("stderr of " + ctx);
  const std::vector<int> close_fds = owned_fds();
  const std::string host = opts_.host;
  pid_t pid = fork_child(
      rank,
      [&] {
        for (int fd : close_fds) ::close(fd);
        int code = 1;
        try {
          code = spec.fn() & 0xff;
        } catch (...) {
          proto::ErrorReport rep;
          rep.rank = rank;
          rep.local_rank = spec.local_rank;
          rep.pid = ::getpid();
          rep.host = host;
          rep.exception_type = demangled_current_exception_type();
          try {
            throw;
          } catch (const std::exception& e) {
            rep.message = e.what();
          } catch (...) {
            rep.message = "(not a std::exception)";
          }
          rep.timestamp_us =
              std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
          std::fprintf(stderr, "%s: %s\n", rep.exception_type.c_str(), rep.message.c_str());
          if (!spec.error_file.empty()) {
            try {
              write_error_file(spec.error_file, rep);
            } catch (const std::exception& e) {
              std::fprintf(stderr, "lspawn: cannot write error file: %s\n", e.what());
            }
          }
          code = 1;
        }
        std::cout.flush();
        std::cerr.flush();
        std::fflush(nullptr);
        ::_exit(code);
      },
      out, err);
  guard(pid);
  Worker& w = add_worker(rank, pid, pid, std::move(out.read), std::move(err.read), spec.error_file);
  w.group_registered = true;
  w.pidfd = sys::pidfd_open(pid, ctx);
  return pid;
}

void Supervisor::adopt(int rank, pid_t pid, pid_t pgid, sys::Fd out, sys::Fd err, std::string error_file) {
  if (pgid > 0) guard(pgid);
  Worker& w = add_worker(rank, pid, pgid, std::move(out), std::move(err), std::move(error_file));
  w.adopted = true;
  w.group_registered = pgid > 0;
}

void Supervisor::notify_exit(int rank, int wait_status) {
  Worker& w = worker(rank);
  if (results_[w.index].exited) return;
  on_exit(w, wait_status);
  advance();
}

void Supervisor::watch_fd(int fd, short events, std::function<void(short)> cb) {
  unwatch_fd(fd);
  watches_.push_back(Watch{fd, events, std::move(cb)});
}

void Supervisor::unwatch_fd(int fd) {
  watches_.erase(std::remove_if(watches_.begin(), watches_.end(), [fd](const Watch& w) { return w.fd == fd; }),
                 watches_.end());
}

void Supervisor::signal_running(int sig) {
  for (auto& w : workers_) {
    auto& r = results_[w->index];
    if (r.exited) continue;
    const std::string ctx = "stopping rank " + std::to_string(w->rank);
    const pid_t target = w->pgid > 0 ? -w->pgid : w->pid;
    try {
      sys::kill(target, sig, ctx);
      if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) {
        sys::kill(target, SIGCONT, ctx);  // a stopped worker must see the signal
      }
    } catch (const sys::SysError& e) {
      // EPERM from a member that changed credentials: report it, keep stopping the others.
      info(e.what());
    }
    if (sig != SIGUSR1 && sig != SIGUSR2 && sig != SIGCONT) {
      r.stop_signal_sent = sig;
      move(r, WorkerEvent::Signal);
    }
  }
}

void Supervisor::begin_stop(int sig) {
  if (phase_ != Phase::Running) return;
  size_t running = 0;
  for (auto& r : results_) running += !r.exited;
  enter(PhaseEvent::Stop);
  stop_deadline_ = Clock::now() + opts_.grace_period;
  if (running == 0) return;
  if (opts_.grace_period.count() <= 0) {
    kill_now();
    return;
  }
  info("sending " + sys::signal_name(sig) + " to " + plural(running, "worker") + " (SIGKILL after a grace period of " +
       seconds_text(opts_.grace_period) + ")");
  signal_running(sig);
}

void Supervisor::terminate(int sig, std::string reason) {
  if (phase_ != Phase::Running) return;
  stop_signal_ = sig;
  stop_reason_ = std::move(reason);
  begin_stop(sig);
  advance();
}

void Supervisor::stop_workers(int sig) {
  if (phase_ != Phase::Running) return;
  begin_stop(sig);
  advance();
}

void Supervisor::new_round(int world_size) {
  if (phase_ != Phase::Finished) throw std::logic_error("lspawn: new_round() while workers are running");
  if (world_size > 0) opts_.world_size = world_size;
  workers_.clear();
  results_.clear();
  by_rank_.clear();
  root_cause_.reset();
  stop_signal_ = 0;
}

std::vector<int> Supervisor::take_signals() {
  std::vector<int> out;
  if (!signal_fd_) return out;
  signalfd_siginfo si;
  while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    out.push_back(static_cast<int>(si.ssi_signo));
  }
  return out;
}

void Supervisor::kill_now() {
  if (phase_ == Phase::Finished) return;
  std::vector<std::string> ranks;
  for (auto& w : workers_)
    if (!results_[w->index].exited) ranks.push_back(std::to_string(w->rank));
  if (!ranks.empty()) {
    std::string list;
    for (auto& r : ranks) list += (list.empty() ? "" : ", ") + r;
    info("sending SIGKILL to " + plural(ranks.size(), "worker") + " (rank " + list + ")");
  }
  signal_running(SIGKILL);
  enter(PhaseEvent::Kill);
  advance();
}

void Supervisor::on_signal(int sig) {
  if (std::find(opts_.report_signals.begin(), opts_.report_signals.end(), sig) != opts_.report_signals.end()) {
    if (opts_.on_report_signal) opts_.on_report_signal(sig);
    return;
  }
  const bool stopping_signal = sig != SIGUSR1 && sig != SIGUSR2;
  if (!stopping_signal) {
    info("received " + sys::signal_name(sig) + "; forwarding it to every worker");
    signal_running(sig);
    return;
  }
  if (phase_ == Phase::Running) {
    stop_signal_ = sig;
    info("received " + sys::signal_name(sig) + "; forwarding it to every worker");
    begin_stop(sig);
  } else if (sig == SIGINT) {
    info("received a second SIGINT");
    kill_now();
  } else if (phase_ == Phase::Stopping) {
    signal_running(sig);
  }
}

void Supervisor::close_stream(Worker& w, int s) {
  if (!w.pipe[s]) return;
  w.pipe[s].reset();
  w.split[s]->finish();
}

void Supervisor::on_readable(Worker& w, int s) {
  char buf[64 * 1024];
  ssize_t n;
  try {
    n = sys::read_some(w.pipe[s].get(), buf, sizeof buf,
                       std::string(stream_name(static_cast<Stream>(s))) + " of rank " + std::to_string(w.rank));
  } catch (const sys::SysError& e) {
    info(e.what());
    n = 0;
  }
  if (n < 0) return;  // EAGAIN
  if (n == 0) {
    close_stream(w, s);
    return;
  }
  w.split[s]->feed(std::string_view(buf, static_cast<size_t>(n)));
}

void Supervisor::drain(Worker& w) {
  // Everything the worker wrote before it exited is in the pipe now; read until EAGAIN/EOF.
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; w.pipe[s] && i < 1024; ++i) {
      char buf[64 * 1024];
      ssize_t n;
      try {
        n = sys::read_some(w.pipe[s].get(), buf, sizeof buf, "drain of rank " + std::to_string(w.rank));
      } catch (const sys::SysError&) {
        n = 0;
      }
      if (n < 0) break;
      if (n == 0) {
        close_stream(w, s);
        break;
      }
      w.split[s]->feed(std::string_view(buf, static_cast<size_t>(n)));
    }
  }
}

void Supervisor::on_exit(Worker& w, int status) {
  WorkerResult& r = results_[w.index];
  r.exited = true;
  r.wait_status = status;
  if (WIFSIGNALED(status)) {
    r.term_signal = WTERMSIG(status);
  } else {
    r.exit_code = WEXITSTATUS(status);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - w.started).count();
  r.exit_time_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  w.pidfd.reset();
  // A shm segment it created and was killed before unlinking (sys/shm_segments.hpp) goes too.
  sys::remove_shm_segments_of(w.pid);
  // Nothing of its process group may outlive it: its own children, if any, go now. The group
  // id cannot have been reused while it still has members, so this hits only ours.
  if (w.pgid > 0) {
    sys::kill(-w.pgid, SIGKILL, "leftovers of rank " + std::to_string(w.rank));
    if (w.group_registered) {
      try {
        guardian_.unregister_group(w.pgid);
      } catch (const sys::SysError& e) {
        info(std::string("guardian: ") + e.what());
      }
      w.group_registered = false;
    }
  }
  drain(w);
  w.drain_deadline = Clock::now() + opts_.drain_timeout;
  move(r, WorkerEvent::Exit);
  if (r.failed() && !r.error_file.empty()) {
    auto ef = read_error_file(r.error_file);
    r.report = std::move(ef.report);
    r.report_problem = std::move(ef.problem);
  }
  if (r.failed() && phase_ == Phase::Running && !root_cause_) {
    root_cause_ = r.rank;
    r.root_cause = true;
    if (opts_.fail_fast) {
      size_t others = 0;
      for (auto& o : results_) others += !o.exited;
      if (others) info(r.describe() + "; stopping the other workers");
      begin_stop(SIGTERM);
    }
  }
}

bool Supervisor::enter(PhaseEvent e) {
  const std::optional<Phase> next = next_phase(phase_, e);
  if (!next) return false;
  phase_ = *next;
  return true;
}

bool Supervisor::move(WorkerResult& r, WorkerEvent e) {
  const std::optional<WorkerState> next = next_worker_state(r.state, e);
  if (!next) return false;
  r.state = *next;
  return true;
}

void Supervisor::advance() {
  bool all_done = true;
  for (auto& w : workers_) {
    auto& r = results_[w->index];
    if (!w->pipe[0] && !w->pipe[1]) move(r, WorkerEvent::Drained);
    all_done = all_done && r.state == WorkerState::Done;
  }
  if (all_done) {
    settle_root_cause();
    enter(PhaseEvent::AllDone);
  }
}

void Supervisor::settle_root_cause() {
  if (!root_cause_ || phase_ == Phase::Finished) return;
  WorkerResult* first = &results_[by_rank_.at(*root_cause_)];
  for (auto& r : results_) {
    const bool own_failure = r.failed() && (!r.killed_by_supervisor() || r.reported_then_stopped());
    if (own_failure && r.failure_time_us() < first->failure_time_us()) first = &r;
  }
  if (first->rank == *root_cause_) return;
  results_[by_rank_.at(*root_cause_)].root_cause = false;
  first->root_cause = true;
  root_cause_ = first->rank;
}

bool Supervisor::step(Clock::time_point deadline) {
  advance();
  if (finished()) return true;
  std::vector<pollfd> pfds;
  // What each pollfd is: kind 0 signalfd, 1 pidfd, 2 pipe, 3 watch; a = worker/watch index, b = stream.
  struct Tag {
    int kind;
    size_t a;
    int b;
  };
  std::vector<Tag> tags;
  if (signal_fd_) {
    pfds.push_back({signal_fd_.get(), POLLIN, 0});
    tags.push_back({0, 0, 0});
  }
  auto wake = deadline;
  const auto now = Clock::now();
  for (size_t i = 0; i < workers_.size(); ++i) {
    auto& w = *workers_[i];
    if (w.pidfd) {
      pfds.push_back({w.pidfd.get(), POLLIN, 0});
      tags.push_back({1, i, 0});
    }
    for (int s = 0; s < 2; ++s) {
      if (w.pipe[s]) {
        pfds.push_back({w.pipe[s].get(), POLLIN, 0});
        tags.push_back({2, i, s});
      }
    }
    if (results_[w.index].state == WorkerState::Draining) wake = std::min(wake, w.drain_deadline);
  }
  for (size_t i = 0; i < watches_.size(); ++i) {
    pfds.push_back({watches_[i].fd, watches_[i].events, 0});
    tags.push_back({3, i, 0});
  }
  if (phase_ == Phase::Stopping) wake = std::min(wake, stop_deadline_);
  int timeout_ms = 0;
  if (wake > now) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    timeout_ms = static_cast<int>(std::min<long long>(ms, 24LL * 3600 * 1000));
  }
  int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
  if (n < 0 && errno != EINTR) sys::throw_errno("poll", "supervisor loop");
  if (n > 0) {
    // Output first, so a worker's lines precede anything printed about its exit.
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (!pfds[k].revents || tags[k].kind != 2) continue;
      auto& w = *workers_[tags[k].a];
      if (w.pipe[tags[k].b]) on_readable(w, tags[k].b);
    }
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (!pfds[k].revents) continue;
      const Tag& t = tags[k];
      if (t.kind == 0) {
        signalfd_siginfo si;
        while (::read(signal_fd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
          on_signal(static_cast<int>(si.ssi_signo));
        }
      } else if (t.kind == 1) {
        auto& w = *workers_[t.a];
        int status = 0;
        if (w.pidfd && sys::waitpid(w.pid, &status, WNOHANG, "rank " + std::to_string(w.rank)) == w.pid) {
          on_exit(w, status);
        }
      } else if (t.kind == 3) {
        // The callback may unwatch (or watch) fds: look the watch up again by fd.
        const int fd = pfds[k].fd;
        for (auto& wt : watches_) {
          if (wt.fd == fd) {
            auto cb = wt.cb;
            cb(pfds[k].revents);
            break;
          }
        }
      }
    }
  }
  const auto after = Clock::now();
  if (phase_ == Phase::Stopping && after >= stop_deadline_) {
    bool any = false;
    for (auto& r : results_) any = any || !r.exited;
    if (any) info("grace period of " + seconds_text(opts_.grace_period) + " is over");
    kill_now();
  }
  for (auto& wp : workers_) {
    auto& w = *wp;
    if (results_[w.index].state == WorkerState::Draining && after >= w.drain_deadline && (w.pipe[0] || w.pipe[1])) {
      info("rank " + std::to_string(w.rank) + " exited but its output pipes are still open after " +
           seconds_text(opts_.drain_timeout) + " (held by a process outside its group); closing them");
      close_stream(w, 0);
      close_stream(w, 1);
    }
  }
  advance();
  return finished();
}

bool Supervisor::run_until(Clock::time_point deadline) {
  while (!finished()) {
    step(deadline);
    if (Clock::now() >= deadline) break;
  }
  return finished();
}

void Supervisor::run() { run_until(Clock::time_point::max()); }

int Supervisor::exit_code() const {
  if (root_cause_) {
    return failure_exit_code(result(*root_cause_));
  }
  if (stop_signal_) return 128 + stop_signal_;
  for (const auto& r : results_)
    if (r.failed()) return r.term_signal ? 128 + r.term_signal : r.exit_code;
  return 0;
}

void Supervisor::detail(std::ostream& os, const WorkerResult& r, const char* head) const {
  const size_t world = opts_.world_size > 0 ? static_cast<size_t>(opts_.world_size) : results_.size();
  os << "lspawn: " << head << r.describe() << "\n";
  os << "lspawn:   rank " << r.rank << " of " << world << ", pid " << r.pid << ", host " << opts_.host << ", after "
     << std::fixed << std::setprecision(3) << r.seconds << std::defaultfloat << " s\n";
  if (opts_.output_note) {
    if (const std::string note = opts_.output_note(r.rank); !note.empty()) os << "lspawn:   " << note << "\n";
  }
  if (!r.exec_error.empty()) os << "lspawn:   " << r.exec_error << "\n";
  if (r.report) {
    const auto& rep = *r.report;
    os << "lspawn:   error: " << (rep.exception_type.empty() ? "" : rep.exception_type + ": ") << rep.message << "\n";
    if (!rep.host.empty() && rep.host != opts_.host) os << "lspawn:   reported from host " << rep.host << "\n";
    if (!rep.backtrace.empty()) {
      os << "lspawn:   backtrace:\n";
      std::istringstream bt(rep.backtrace);
      for (std::string line; std::getline(bt, line);) os << "lspawn:     " << line << "\n";
    }
  } else if (!r.report_problem.empty()) {
    os << "lspawn:   error file unreadable: " << r.report_problem << "\n";
  } else if (r.exec_error.empty()) {
    os << "lspawn:   error file: none written (" << (r.error_file.empty() ? "not set" : r.error_file) << ")\n";
  }
}

std::optional<int> Supervisor::earliest_failure() const {
  const WorkerResult* first = nullptr;
  for (const auto& r : results_) {
    const bool own_failure = r.failed() && (!r.killed_by_supervisor() || r.reported_then_stopped());
    if (own_failure && (!first || r.failure_time_us() < first->failure_time_us())) first = &r;
  }
  if (!first) return std::nullopt;
  return first->rank;
}

std::string Supervisor::failure_report(int rank) const {
  std::ostringstream os;
  detail(os, result(rank), "root cause: ");
  return os.str();
}

int Supervisor::failure_exit_code(const WorkerResult& r) {
  if (r.reported_then_stopped()) return 1;  // what run_main returns for an uncaught exception
  return r.term_signal ? 128 + r.term_signal : r.exit_code;
}

std::string Supervisor::root_cause_report() const {
  if (!root_cause_) return "";
  std::ostringstream os;
  detail(os, result(*root_cause_), "root cause: ");
  return os.str();
}

std::string Supervisor::summary(bool include_root_cause) const {
  std::ostringstream os;
  bool any = false;
  if (root_cause_) {
    if (include_root_cause) detail(os, result(*root_cause_), "root cause: ");
    any = true;
  } else if (stop_signal_) {
    os << "lspawn: stopped by " << (stop_reason_.empty() ? sys::signal_name(stop_signal_) : stop_reason_) << "\n";
    any = true;
  }
  for (const auto& r : results_) {
    if (root_cause_ && r.rank == *root_cause_) continue;
    if (!r.exited) continue;
    if (r.killed_by_supervisor() && !r.reported_then_stopped()) {
      os << "lspawn: process " << r.rank << " (pid " << r.pid << ") terminated by lspawn with "
         << sys::signal_name(r.term_signal) << "\n";
      any = true;
    } else if (r.failed()) {
      if (r.stop_signal_sent && !r.reported_then_stopped()) {
        os << "lspawn: " << r.describe() << " (pid " << r.pid << ") after lspawn sent "
           << sys::signal_name(r.stop_signal_sent) << "\n";
      } else if (root_cause_ || stop_signal_) {
        // Failed on its own after the root cause: one line, not a second full report.
        os << "lspawn: also " << r.describe() << " (pid " << r.pid << ")";
        if (r.report) {
          os << ": " << (r.report->exception_type.empty() ? "" : r.report->exception_type + ": ") << r.report->message;
        }
        os << "\n";
      } else {
        detail(os, r, "");
      }
      any = true;
    } else if (any || root_cause_) {
      os << "lspawn: process " << r.rank << " (pid " << r.pid << ") exited with code 0\n";
    }
  }
  if (!root_cause_ && !stop_signal_) {
    bool failed = false;
    for (const auto& r : results_) failed = failed || r.failed();
    if (!failed) return "";
  }
  return os.str();
}

}  // namespace lspawn
