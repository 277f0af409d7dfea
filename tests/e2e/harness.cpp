#include "harness.hpp"

#include "supervisor/port.hpp"

#include <fstream>
#include <system_error>
#include <thread>
#include <sstream>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/env_contract.hpp"

namespace lspawn::test {

std::string lspawn_bin() { return LSPAWN_BIN; }
std::string worker_bin() { return LSPAWN_TEST_WORKER; }
std::string hang_worker_bin() { return LSPAWN_TEST_HANG_WORKER; }

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

Child::Child(const std::vector<std::string>& argv_in, const std::vector<std::string>& extra_env) {
  const std::vector<std::string> argv = with_start_method(argv_in);
  auto out = sys::make_pipe("child stdout");
  auto err = sys::make_pipe("child stderr");
  std::vector<std::string> env = env::current_environment();
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) sys::throw_errno("fork", "test child");
  if (pid_ == 0) {
    ::dup2(out.write.get(), 1);
    ::dup2(err.write.get(), 2);
    // Tests may block signals; the child must start with a clean mask.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(a[0], a.data(), e.data());
    _exit(127);
  }
  out_fd_ = std::move(out.read);
  err_fd_ = std::move(err.read);
}

Child::~Child() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
  }
}

bool Child::pump(std::chrono::milliseconds timeout) {
  pollfd p[2];
  int n = 0;
  int which[2];
  if (out_fd_) {
    p[n] = {out_fd_.get(), POLLIN, 0};
    which[n++] = 0;
  }
  if (err_fd_) {
    p[n] = {err_fd_.get(), POLLIN, 0};
    which[n++] = 1;
  }
  if (n == 0) return false;
  int r = ::poll(p, n, static_cast<int>(timeout.count()));
  if (r <= 0) return true;
  for (int i = 0; i < n; ++i) {
    if (!p[i].revents) continue;
    char buf[65536];
    sys::Fd& fd = which[i] == 0 ? out_fd_ : err_fd_;
    ssize_t got = ::read(fd.get(), buf, sizeof buf);
    if (got <= 0) {
      fd.reset();
    } else {
      (which[i] == 0 ? out_ : err_).append(buf, static_cast<size_t>(got));
    }
  }
  return true;
}

bool Child::wait_stdout_count(const std::string& needle, int n, std::chrono::milliseconds timeout) {
  return wait_output([&](const std::string& o, const std::string&) { return count(o, needle) >= n; },
                     timeout);
}

void Child::signal(int sig) { ::kill(pid_, sig); }

int Child::wait(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  // Output first: lspawn closes its pipes when it exits (the guardian holds none).
  while (out_fd_ || err_fd_) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) return -1;
    pump(std::chrono::duration_cast<std::chrono::milliseconds>(end - now));
  }
  for (;;) {
    int st;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return st;
    }
    if (std::chrono::steady_clock::now() >= end) return -1;
    ::usleep(1000);
  }
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
  if (r.status != -1) r.exit_code = WIFSIGNALED(r.status) ? 128 + WTERMSIG(r.status) : WEXITSTATUS(r.status);
  return r;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::set<pid_t> worker_pids(const std::string& out) {
  std::set<pid_t> pids;
  for (const auto& line : lines(out)) {
    const auto at = line.find("ready pid ");
    if (at != std::string::npos) pids.insert(static_cast<pid_t>(std::stol(line.substr(at + 10))));
  }
  return pids;
}

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

TempDir::TempDir() : path(sys::make_temp_dir("lspawn-test-")) {}
TempDir::~TempDir() { sys::remove_tree(path); }

bool alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(f, s)) return false;
  const auto close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return false;
  const char state = s[close + 2];
  return state != 'Z' && state != 'X';
}

Subreaper::Subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw std::system_error(errno, std::generic_category(), "prctl(PR_SET_CHILD_SUBREAPER)");
  }
}

Subreaper::~Subreaper() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

std::set<pid_t> alive_after(const std::set<pid_t>& pids, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  std::set<pid_t> left = pids;
  for (;;) {
    for (pid_t p : pids) ::waitpid(p, nullptr, WNOHANG);
    for (auto it = left.begin(); it != left.end();) it = alive(*it) ? std::next(it) : left.erase(it);
    if (left.empty() || std::chrono::steady_clock::now() >= end) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int free_port() {
  lspawn::PortReservation r("127.0.0.1", 0);
  return r.port();
}

int code_of(int status) {
  if (status == -1) return -1;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

Daemon::Daemon(const std::vector<std::string>& extra) {
  socket_ = dir_.path + "/daemon.sock";
  std::vector<std::string> argv{lspawn_bin(), "daemon", "--socket", socket_};
  argv.insert(argv.end(), extra.begin(), extra.end());
  child_ = std::make_unique<Child>(argv);
  if (!child_->wait_output([](const std::string&, const std::string& err) { return err.find("listening on") != std::string::npos; },
                           std::chrono::seconds(20))) {
    throw std::runtime_error("lspawn daemon did not start: " + child_->err());
  }
}

Daemon::~Daemon() {
  child_->signal(SIGTERM);
  if (child_->wait(std::chrono::seconds(10)) == -1) child_->signal(SIGKILL);
}

std::vector<std::string> Daemon::warm_args() const {
  return {"--start-method", "warm", "--daemon-socket", socket_};
}

}  // namespace lspawn::test
