// Exceptions thrown by lspawn::spawn() and ProcessContext::join().
//
// Messages take the form users of torch.multiprocessing.spawn grep for (docs/spawn.md, Failures):
//   ProcessExitedException: "process 1 terminated with exit code 3",
//                           "process 0 terminated with signal SIGABRT"
//   ProcessRaisedException: "process 1 terminated with the following error:\n"
//                           "std::runtime_error: <what()>" [+ "\n" + backtrace]
// The failing rank is always the root cause: the first worker to fail, not a sibling that was
// terminated because of it.
#pragma once

#include <stdexcept>
#include <string>

#include <sys/types.h>

#include "proto/error.hpp"

namespace lspawn {

// spawn() could not start (bad options, unregistered function, fork/exec failure, ...).
// Nothing is left running when it is thrown.
class SpawnError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

// SpawnOptions::hang_timeout expired: no worker made progress in its collectives. report() is
// the hang report (docs/hang-diagnosis.md): which ranks wait in which op, which are behind.
class HangError : public SpawnError {
 public:
  explicit HangError(std::string report)
      : SpawnError("spawn: hang: no worker made progress in its collectives (SpawnOptions::hang_timeout)\n" + report),
        report_(std::move(report)) {}
  const std::string& report() const { return report_; }

 private:
  std::string report_;
};

// Base of the two ways a worker fails. index() is the failing worker's process index (rank).
class ProcessException : public lspawn::Error {
 public:
  ProcessException(const std::string& message, int index, pid_t pid)
      : lspawn::Error(message), index_(index), pid_(pid) {}
  int index() const { return index_; }
  pid_t pid() const { return pid_; }

 private:
  int index_;
  pid_t pid_;
};

// The worker's function threw. type() is the demangled C++ type, what_text() its what().
class ProcessRaisedException : public ProcessException {
 public:
  ProcessRaisedException(int index, pid_t pid, std::string type, std::string what_text, std::string backtrace);
  const std::string& type() const { return type_; }
  const std::string& what_text() const { return what_; }
  const std::string& backtrace() const { return backtrace_; }

 private:
  std::string type_, what_, backtrace_;
};

// The worker exited non-zero or died of a signal without raising (exit(3), abort(), SIGKILL).
// Exactly one of exit_code() (!= 0) and signal() (!= 0) is set.
class ProcessExitedException : public ProcessException {
 public:
  ProcessExitedException(int index, pid_t pid, int exit_code, int signal);
  int exit_code() const { return exit_code_; }
  int signal() const { return signal_; }
  // "SIGABRT", or "" when the worker exited.
  std::string signal_name() const;

 private:
  int exit_code_, signal_;
};

}  // namespace lspawn
