// Test harness for end-to-end tests of the built `lspawn` binary: runs it as a real process
// (a ChildProcess of tests/support: stdout/stderr on pipes, waits on output, signals, the exit
// with a generous upper bound) under the start method ctest chose, and `lspawn daemon` for warm
// runs. Brings the support headers every e2e test uses.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <sys/types.h>

#include "support/child.hpp"
#include "support/files.hpp"
#include "support/pids.hpp"
#include "support/ports.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

namespace lspawn::test {

// Paths injected by CMake.
std::string lspawn_bin();
std::string worker_bin();
std::string hang_worker_bin();  // tests/e2e/fixtures/hang_worker.cpp (links the collectives)
std::string fence_probe_bin();  // tests/e2e/fixtures/fence_probe.cpp (links the runtime)
// The Python of the LibTorch line under test (CMake: LSPAWN_TEST_PYTHON); the environment's
// LSPAWN_TEST_PYTHON runs the Python cases under another (the other line's torch) without a rebuild.
std::string test_python();
// Whether test_python() imports `module` (e.g. "lightning": the 2.x venv of
// scripts/setup-torch2.sh installs it).
bool python_imports(const std::string& module);
// Whether `python -c code` exits 0 under test_python().
bool python_runs(const std::string& code);

// argv of an lspawn run (argv[0] == lspawn_bin()) with "--start-method M" inserted when the
// environment has LSPAWN_E2E_START_METHOD=M (how ctest runs the suite again, under
// --start-method forkserver and warm); any other argv (and `lspawn status|daemon ...`)
// unchanged. For M=warm also "--daemon-socket S": the socket of one `lspawn daemon` this test
// process starts on first use (and kills at exit).
std::vector<std::string> with_start_method(std::vector<std::string> argv);

// An lspawn run (or any program) as a ChildProcess, its argv through with_start_method().
class Child : public ChildProcess {
 public:
  // Starts `argv` (argv[0] a path) with the current environment plus `extra_env` ("K=V").
  explicit Child(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {})
      : ChildProcess(with_start_method(argv), extra_env) {}
};

struct RunResult {
  int status = -1;     // raw wait status
  int exit_code = -1;  // WEXITSTATUS, or 128+signal
  std::string out, err;
  double seconds = 0;
};

// Runs `lspawn args...` to completion (20 s upper bound).
RunResult run_lspawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {});

// The pids the workers printed ("ready pid N", the hang tests' workers).
std::set<pid_t> worker_pids(const std::string& out);
// rank -> (name -> value), from the "[rank N] NAME=value" lines (or "[HOST rank N] NAME=value",
// the multi-node prefix) of the worker fixture's `env` mode.
std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out);

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

}  // namespace lspawn::test
