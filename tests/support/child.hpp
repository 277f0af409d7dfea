// ChildProcess: a program a test starts (fork + exec, with a clean signal mask) and owns, or a
// function of the test's own binary run in a forked child (no exec: a test worker linked into
// the test, which has loaded LibTorch already). Its stdout and stderr go either to pipes the test reads while it waits (out(), err(),
// wait_output()), or to one file (output()) when several children run while the test waits on
// one of them. The test waits with an upper bound: wait() gives up and leaves the child running,
// wait_or_kill() SIGKILLs a child that overstays. A child still running when the object goes is
// SIGKILLed and reaped. Tests only.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

#include "sys/sys.hpp"

namespace lspawn::test {

// How a child ended.
struct ExitStatus {
  bool exited = false;           // exited normally
  int code = -1;                 // valid when exited
  int signal = 0;                // terminating signal, when !exited
  bool timed_out = false;        // killed by wait_or_kill() after its deadline
  std::string describe() const;  // "exit code 3", "signal Killed", "timed out (killed)"
};

// The exit code of a raw wait status as lspawn reports it: the code, 128+N for signal N; -1 for
// -1 (ChildProcess::wait's "still running").
int code_of(int status);

class ChildProcess {
 public:
  // What a child started with an output file inherits of this process's environment.
  enum class Inherit {
    all_but_contract,  // all but the env contract's variables (RANK, MASTER_PORT, ...,
                       // TORCHELASTIC_*, LSPAWN_*): a worker that must see only what the test gives
    all,               // everything
  };

  // Starts `argv` (argv[0] a path) with this process's environment plus `extra_env` ("K=V");
  // stdout and stderr on pipes, read into out() and err() while the test waits.
  explicit ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {});
  // Starts `argv` (argv[0] a path) with what `inherit` keeps of this process's environment, plus
  // `env`; stdin /dev/null, stdout and stderr into the file `output_path` (truncated). Throws
  // std::runtime_error.
  ChildProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
               const std::string& output_path, Inherit inherit = Inherit::all_but_contract);
  // Runs `body` in a forked child and exits with what it returns, in place of an exec of the
  // program: the environment as above, signal dispositions as an exec leaves them (handled ones
  // back to default, ignored ones kept), a clean mask, stdin /dev/null, stdout and stderr into
  // `output_path`. Only from a process with a single thread (a lock held by another thread at
  // the fork would stay held in the child): throws std::logic_error otherwise, so a caller that
  // may have threads (a ThreadSanitizer build has its own) asks count_threads() == 1 first
  // (spawn/threads.hpp).
  ChildProcess(const std::function<int()>& body, const std::map<std::string, std::string>& env,
               const std::string& output_path, Inherit inherit = Inherit::all_but_contract);
  ~ChildProcess();  // SIGKILLs and reaps a child still running
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ChildProcess& operator=(ChildProcess&&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `pred` holds for (stdout, stderr) or `timeout`; returns whether it held.
  template <class Pred>
  bool wait_output(Pred pred, std::chrono::milliseconds timeout);
  // Waits until stdout contains `needle` `count` times.
  bool wait_stdout_count(const std::string& needle, int count, std::chrono::milliseconds timeout);
  void signal(int sig);
  // Waits for the exit (reading the pipes to their end first); returns the raw wait status, or
  // -1 when `timeout` passed first (the child is left running).
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Waits at most `limit`; then SIGKILLs it and reports timed_out.
  ExitStatus wait_or_kill(std::chrono::milliseconds limit);
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  // Everything it wrote: the output file, or out() then err().
  std::string output() const;

 private:
  // Reads what is available within `timeout`; returns false when both pipes are at EOF.
  bool pump(std::chrono::milliseconds timeout);
  pid_t pid_ = -1;
  bool reaped_ = false;
  sys::Fd out_fd_, err_fd_;
  std::string out_, err_;
  std::string output_path_;  // "" for pipes
};

template <class Pred>
bool ChildProcess::wait_output(Pred pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred(out_, err_)) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) return false;
    if (!pump(std::chrono::duration_cast<std::chrono::milliseconds>(end - now))) return pred(out_, err_);
  }
  return true;
}

}  // namespace lspawn::test
