// Test harness for end-to-end tests of the built `lspawn` binary: runs it as a real process
// with its stdout/stderr on pipes, lets a test wait for output, send signals, and wait for
// the exit with a generous upper bound.
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <sys/types.h>

#include "supervisor/sys.hpp"

namespace lspawn::test {

// Paths injected by CMake.
std::string lspawn_bin();
std::string worker_bin();
std::string hang_worker_bin();  // tests/e2e/fixtures/hang_worker.cpp (links the collectives)

// argv of an lspawn run (argv[0] == lspawn_bin()) with "--start-method M" inserted when the
// environment has LSPAWN_E2E_START_METHOD=M (how ctest runs the suite again, under
// --start-method forkserver and warm); any other argv (and `lspawn status|daemon ...`)
// unchanged. For M=warm also "--daemon-socket S": the socket of one `lspawn daemon` this test
// process starts on first use (and kills at exit).
std::vector<std::string> with_start_method(std::vector<std::string> argv);

class Child {
 public:
  // Starts `argv` (argv[0] a path) with the current environment plus `extra_env` ("K=V").
  explicit Child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {});
  ~Child();  // SIGKILLs and reaps if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `pred` holds for (stdout, stderr) or `timeout`; returns whether it held.
  template <class Pred>
  bool wait_output(Pred pred, std::chrono::milliseconds timeout);
  // Waits until stdout contains `needle` `count` times.
  bool wait_stdout_count(const std::string& needle, int count, std::chrono::milliseconds timeout);
  void signal(int sig);
  // Waits for exit (draining output); returns the raw wait status, or -1 on timeout.
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  // Reads what is available within `timeout`; returns false when both pipes are at EOF.
  bool pump(std::chrono::milliseconds timeout);
  pid_t pid_ = -1;
  bool reaped_ = false;
  sys::Fd out_fd_, err_fd_;
  std::string out_, err_;
};

template <class Pred>
bool Child::wait_output(Pred pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred(out_, err_)) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) return false;
    if (!pump(std::chrono::duration_cast<std::chrono::milliseconds>(end - now))) return pred(out_, err_);
  }
  return true;
}

struct RunResult {
  int status = -1;  // raw wait status
  int exit_code = -1;  // WEXITSTATUS, or 128+signal
  std::string out, err;
  double seconds = 0;
};

// Runs `lspawn args...` to completion (20 s upper bound).
RunResult run_lspawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {});

// A port on 127.0.0.1 that was free a moment ago (every "node" of a multi-node test is told the same).
int free_port();
// The exit code of a wait status as lspawn reports it: the code, 128+N for signal N; -1 for -1
// (Child::wait's "still running").
int code_of(int status);

// Occurrences of `needle` in `hay`.
int count(const std::string& hay, const std::string& needle);
// Whether `needle` occurs in `hay`.
bool has(const std::string& hay, const std::string& needle);
// The pids the workers printed ("ready pid N", the hang tests' workers).
std::set<pid_t> worker_pids(const std::string& out);
// Lines of `text` (without '\n').
std::vector<std::string> lines(const std::string& text);
// The whole content of the file at `path` ("" when it cannot be read).
std::string slurp(const std::string& path);

// A temporary directory removed at scope exit.
struct TempDir {
  std::string path;
  TempDir();
  ~TempDir();
};

// `lspawn daemon` (docs/warm-start.md) on a socket in a private temp directory of its own, for
// the object's life; its stderr (the daemon's log) is err() of process(). Destruction stops it
// (SIGTERM; SIGKILL after 10 s) and reaps it.
class Daemon {
 public:
  // Starts it with `extra` options and waits (20 s) until it listens. Throws std::runtime_error.
  explicit Daemon(const std::vector<std::string>& extra = {});
  ~Daemon();
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return child_->pid(); }
  Child& process() { return *child_; }
  // "--start-method", "warm", "--daemon-socket", socket()
  std::vector<std::string> warm_args() const;

 private:
  TempDir dir_;
  std::string socket_;
  std::unique_ptr<Child> child_;
};

// True while `pid` exists and is not a zombie (reads /proc/<pid>/stat).
bool alive(pid_t pid);

// While it lives, this process is a child subreaper (PR_SET_CHILD_SUBREAPER): orphans of what a
// test started come to it, so that alive_after() reaps them instead of seeing zombies it cannot
// reap. Destruction reaps every child left and turns it off. Throws std::system_error.
class Subreaper {
 public:
  Subreaper();
  ~Subreaper();
  Subreaper(const Subreaper&) = delete;
  Subreaper& operator=(const Subreaper&) = delete;
};

// Waits up to `limit` for every pid of `pids` to be gone (reaping those that are our children,
// e.g. orphans reparented to a subreaper test); returns the ones still alive.
std::set<pid_t> alive_after(const std::set<pid_t>& pids, std::chrono::milliseconds limit);

}  // namespace lspawn::test
