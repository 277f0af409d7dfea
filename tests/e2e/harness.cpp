#include "harness.hpp"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace lspawn::test {

std::string lspawn_bin() { return LSPAWN_BIN; }
std::string worker_bin() { return LSPAWN_TEST_WORKER; }
std::string hang_worker_bin() { return LSPAWN_TEST_HANG_WORKER; }
std::string fence_probe_bin() { return LSPAWN_TEST_FENCE_PROBE; }

std::string test_python() {
  const char* env = std::getenv("LSPAWN_TEST_PYTHON");
  return env ? env : LSPAWN_TEST_PYTHON;
}

bool python_runs(const std::string& code) {
  Child c({test_python(), "-c", code});
  return code_of(c.wait(std::chrono::seconds(120))) == 0;
}

bool python_imports(const std::string& module) { return python_runs("import " + module); }

std::vector<std::string> with_start_method(std::vector<std::string> argv) {
  const char* m = std::getenv("LSPAWN_E2E_START_METHOD");
  // Subcommands (`lspawn status PID`, `lspawn daemon`) take no launcher options.
  const bool subcommand = argv.size() > 1 && (argv[1] == "status" || argv[1] == "daemon");
  if (m && *m && !argv.empty() && argv[0] == lspawn_bin() && !subcommand) {
    if (std::string(m) == "warm") {
      static Daemon daemon;  // one per test process, stopped at exit
      const auto w = daemon.warm_args();
      argv.insert(argv.begin() + 1, w.begin(), w.end());
    } else {
      argv.insert(argv.begin() + 1, {"--start-method", m});
    }
  }
  return argv;
}

RunResult run_lspawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv{lspawn_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto t0 = std::chrono::steady_clock::now();
  Child c(argv, extra_env);
  RunResult r;
  r.status = c.wait();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.out = c.out();
  r.err = c.err();
  r.exit_code = code_of(r.status);
  return r;
}

std::set<pid_t> worker_pids(const std::string& out) {
  std::set<pid_t> pids;
  for (const auto& line : lines(out)) {
    const auto at = line.find("ready pid ");
    if (at != std::string::npos) pids.insert(static_cast<pid_t>(std::stol(line.substr(at + 10))));
  }
  return pids;
}

std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> byrank;
  for (const auto& l : lines(out)) {
    // "[rank N] NAME=value" or "[HOST rank N] NAME=value"
    const auto close = l.find("] ");
    if (l.empty() || l[0] != '[' || close == std::string::npos) continue;
    const std::string label = l.substr(1, close - 1);
    const auto rk = label.rfind("rank ");
    if (rk == std::string::npos || (rk != 0 && label[rk - 1] != ' ')) continue;
    const std::string kv = l.substr(close + 2);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    byrank[std::stoi(label.substr(rk + 5))][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return byrank;
}

Daemon::Daemon(const std::vector<std::string>& extra) {
  socket_ = dir_.path + "/daemon.sock";
  std::vector<std::string> argv{lspawn_bin(), "daemon", "--socket", socket_};
  argv.insert(argv.end(), extra.begin(), extra.end());
  child_ = std::make_unique<Child>(argv);
  if (!child_->wait_output(
          [](const std::string&, const std::string& err) { return err.find("listening on") != std::string::npos; },
          std::chrono::seconds(20))) {
    throw std::runtime_error("lspawn daemon did not start: " + child_->err());
  }
}

Daemon::~Daemon() {
  child_->signal(SIGTERM);
  if (child_->wait(std::chrono::seconds(10)) == -1) child_->signal(SIGKILL);
}

std::vector<std::string> Daemon::warm_args() const { return {"--start-method", "warm", "--daemon-socket", socket_}; }

}  // namespace lspawn::test
