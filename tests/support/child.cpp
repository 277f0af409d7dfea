#include "support/child.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spawn/threads.hpp"
#include "support/files.hpp"
#include "support/text.hpp"

extern char** environ;

namespace lspawn::test {
namespace {

bool is_contract_var(const std::string& name) {
  static const char* const kNames[] = {"RANK",        "LOCAL_RANK",       "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",  "GROUP_WORLD_SIZE", "ROLE_RANK",  "ROLE_WORLD_SIZE",
                                       "MASTER_ADDR", "MASTER_PORT"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return name.rfind("TORCHELASTIC_", 0) == 0 || name.rfind("LSPAWN_", 0) == 0;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// fork + exec of argv with envp, the child's fd `in` as stdin (-1: inherited), `out` and `err`
// as stdout and stderr. Only async-signal-safe calls between fork and exec (the test may have
// threads).
pid_t start(std::vector<std::string> argv, std::vector<std::string> env, int in, int out, int err) {
  auto a = pointers(argv);
  auto e = pointers(env);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) sys::throw_errno("fork", "test child " + argv[0]);
  if (pid == 0) {
    if (in >= 0) ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    // Tests may block signals; the child must start with a clean mask.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(a[0], a.data(), e.data());
    _exit(127);
  }
  return pid;
}

// The environment of a child started with an output file: what `inherit` keeps of this
// process's, then `env`.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& env,
                                           ChildProcess::Inherit inherit) {
  std::vector<std::string> envs;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    const bool kept = inherit == ChildProcess::Inherit::all || !is_contract_var(name);
    if (kept && env.count(name) == 0) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  return envs;
}

// stdin (/dev/null) and stdout+stderr (`output_path`, truncated) of a child with an output file.
struct StdFiles {
  sys::Fd in, out;
};
StdFiles std_files(const std::string& output_path) {
  StdFiles f;
  f.in = sys::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!f.in) sys::throw_errno("open", "/dev/null");
  f.out = sys::Fd(::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!f.out) sys::throw_errno("open", output_path);
  return f;
}

}  // namespace

std::string ExitStatus::describe() const {
  if (timed_out) return "timed out (killed)";
  if (exited) return "exit code " + std::to_string(code);
  return std::string("signal ") + strsignal(signal);
}

int code_of(int status) {
  if (status == -1) return -1;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  auto out = sys::make_pipe("child stdout");
  auto err = sys::make_pipe("child stderr");
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  pid_ = start(argv, env, -1, out.write.get(), err.write.get());
  out_fd_ = std::move(out.read);
  err_fd_ = std::move(err.read);
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                           const std::string& output_path, Inherit inherit)
    : output_path_(output_path) {
  const StdFiles files = std_files(output_path);
  pid_ = start(argv, child_environment(env, inherit), files.in.get(), files.out.get(), files.out.get());
}

ChildProcess::ChildProcess(const std::function<int()>& body, const std::map<std::string, std::string>& env,
                           const std::string& output_path, Inherit inherit)
    : output_path_(output_path) {
  if (count_threads() != 1)
    throw std::logic_error(
        "ChildProcess: a forked body needs a single-threaded test process (/proc/self/task lists more)");
  const StdFiles files = std_files(output_path);
  // The child's environment, as for a program, computed before the fork (the child only installs it).
  std::vector<std::string> envs = child_environment(env, inherit);
  // Nothing buffered here may be written again by the child.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) sys::throw_errno("fork", "test child of a function");
  if (pid_ > 0) return;
  ::dup2(files.in.get(), 0);
  ::dup2(files.out.get(), 1);
  ::dup2(files.out.get(), 2);
  // As an exec leaves them: handlers (Catch's among them) back to default, SIG_IGN kept.
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction now {};
    if (s != SIGKILL && s != SIGSTOP && ::sigaction(s, nullptr, &now) == 0 && now.sa_handler != SIG_IGN)
      ::signal(s, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::clearenv();
  for (std::string& kv : envs) ::putenv(kv.data());  // envs lives until _exit
  int rc = 70;
  try {
    rc = body();
  } catch (const std::exception& e) {
    std::cerr << "test child: uncaught exception: " << e.what() << std::endl;
  } catch (...) {
    std::cerr << "test child: uncaught exception" << std::endl;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(rc);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      reaped_(other.reaped_),
      out_fd_(std::move(other.out_fd_)),
      err_fd_(std::move(other.err_fd_)),
      out_(std::move(other.out_)),
      err_(std::move(other.err_)),
      output_path_(std::move(other.output_path_)) {
  other.pid_ = -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
  }
}

bool ChildProcess::pump(std::chrono::milliseconds timeout) {
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

bool ChildProcess::wait_stdout_count(const std::string& needle, int n, std::chrono::milliseconds timeout) {
  return wait_output([&](const std::string& o, const std::string&) { return count(o, needle) >= n; }, timeout);
}

void ChildProcess::signal(int sig) { ::kill(pid_, sig); }

int ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  // Output first: the pipes close when the child (and whatever it started) exits.
  while (out_fd_ || err_fd_) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) return -1;
    pump(std::chrono::duration_cast<std::chrono::milliseconds>(end - now));
  }
  for (;;) {
    int st;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return st;
    }
    if (r < 0 && errno != EINTR) sys::throw_errno("waitpid", "test child " + std::to_string(pid_));
    if (std::chrono::steady_clock::now() >= end) return -1;
    ::usleep(1000);
  }
}

ExitStatus ChildProcess::wait_or_kill(std::chrono::milliseconds limit) {
  ExitStatus s;
  int st = wait(limit);
  if (st == -1) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
    reaped_ = true;
    s.timed_out = true;
  }
  if (WIFEXITED(st)) {
    s.exited = true;
    s.code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    s.signal = WTERMSIG(st);
  }
  return s;
}

std::string ChildProcess::output() const { return output_path_.empty() ? out_ + err_ : read_file(output_path_); }

}  // namespace lspawn::test
