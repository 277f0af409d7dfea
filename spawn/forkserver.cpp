#include "spawn/forkserver.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>

#include "sys/child_setup.hpp"
#include "sys/fd_frame.hpp"
#include "spawn/errors.hpp"
#include "spawn/fork_loop.hpp"
#include "spawn/init_detail.hpp"
#include "spawn/registry.hpp"
#include "spawn/threads.hpp"
#include "spawn/worker.hpp"
#include "proto/wire.hpp"

namespace lspawn {
namespace {

// ---- server side (runs in the forked server; single-threaded; never returns) ---------------

void close_all_fds_except(std::initializer_list<int> keep) {
  std::vector<int> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int dir_fd = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const int fd = std::atoi(e->d_name);
      if (fd > 2 && fd != dir_fd) fds.push_back(fd);
    }
    ::closedir(d);
  }
  for (int fd : fds) {
    bool kept = false;
    for (int k : keep) kept = kept || k == fd;
    if (!kept) sys::close(fd);
  }
}

// Every signal back to its default disposition, as exec would do.
void reset_signal_handlers() {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
}

std::string check_registered(const proto::ForkRequest& req) {
  if (FunctionRegistry::global().find(req.call.function)) return {};
  return "function '" + req.call.function +
         "' is not registered in the forkserver's program (LSPAWN_REGISTER); registered: " +
         FunctionRegistry::global().names();
}

// The forked server of spawn(): serves requests; in each worker, runs the registered function.
[[noreturn]] void serve(int sock, int exits, pid_t owner) noexcept {
  close_all_fds_except({sock, exits});
  reset_signal_handlers();  // the owner's handlers (e.g. a test framework's) are not ours
  const proto::ForkRequest req = fork_loop::serve(sock, exits, owner, check_registered);
  // A worker from here on.
  const proto::SpawnCall& call = req.call;
  const Invoker* invoker = FunctionRegistry::global().find(call.function);
  WorkerBody body;
  body.index = call.index;
  body.nprocs = call.nprocs;
  body.result_path = call.want_result ? call.result_path : std::string();
  if (const char* ef = std::getenv("TORCHELASTIC_ERROR_FILE")) body.error_file = ef;
  body.call = [&] { return (*invoker)(call.index, call.args); };
  const int code = run_worker(body);
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

Forkserver::Forkserver(pid_t pid, sys::Fd requests, sys::Fd exits)
    : pid_(pid), owner_(::getpid()), requests_(std::move(requests)), exits_(std::move(exits)) {}

std::unique_ptr<Forkserver> Forkserver::start() {
  const int threads = count_threads();
  if (threads > init_detail::thread_baseline()) {
    std::fprintf(stderr,
                 "lspawn: warning: starting the forkserver while %d threads run; start it "
                 "first thing in main (lspawn::init with StartupOptions::start_forkserver)\n",
                 threads);
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    sys::throw_errno("socketpair", "forkserver request socket");
  }
  sys::Fd parent_end(sv[0]), server_end(sv[1]);
  sys::Pipe exits = sys::make_pipe("forkserver exit pipe");
  const pid_t owner = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) sys::throw_errno("fork", "forkserver");
  if (pid == 0) serve(server_end.get(), exits.write.get(), owner);
  server_end.reset();
  exits.write.reset();
  sys::set_nonblocking(exits.read.get(), "forkserver exit pipe");
  return std::unique_ptr<Forkserver>(new Forkserver(pid, std::move(parent_end), std::move(exits.read)));
}

std::unique_ptr<Forkserver> Forkserver::exec(const std::string& path, const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env,
                                             std::chrono::milliseconds ready_timeout, const sigset_t* interrupt) {
  if (argv.empty()) throw std::invalid_argument("lspawn: Forkserver::exec with an empty argv");
  const std::string what = "forkserver '" + path + "'";
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    sys::throw_errno("socketpair", what + " request socket");
  }
  sys::Fd parent_end(sv[0]), server_end(sv[1]);
  sys::Pipe exits = sys::make_pipe(what + " exit pipe");
  sys::Pipe status = sys::make_pipe(what + " exec status");
  sys::Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull) sys::throw_errno("open", "/dev/null");
  // Everything the child needs is built before fork: it only makes system calls.
  std::vector<std::string> full_env = env;
  full_env.push_back(std::string(kForkserverFdsEnv) + "=" + std::to_string(server_end.get()) + "," +
                     std::to_string(exits.write.get()));
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : full_env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const int keep[2] = {server_end.get(), exits.write.get()};
  const int status_w = status.write.get();
  const pid_t owner = ::getpid();
  sigset_t empty;
  sigemptyset(&empty);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) sys::throw_errno("fork", what);
  if (pid == 0) {
    sys::child_setup(owner);  // terminal signals (^C) go to lspawn, which stops workers gracefully
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(devnull.get(), 0);
    ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
    for (int fd : keep) ::fcntl(fd, F_SETFD, 0);
    sys::execve_or_report(path.c_str(), cargv.data(), cenv.data(), status_w);
  }
  ::setpgid(pid, pid);
  server_end.reset();
  exits.write.reset();
  status.write.reset();
  auto reap = [&](const std::string& why) -> SpawnError {
    ::kill(pid, SIGKILL);
    int st = 0;
    try {
      sys::waitpid(pid, &st, 0, what);
    } catch (...) {}
    return SpawnError(what + " (pid " + std::to_string(pid) + ") " + why);
  };
  if (const int exec_errno = sys::read_exec_errno(status.read.get()); exec_errno != 0) {
    throw reap(std::string("could not be executed: ") + std::strerror(exec_errno));
  }
  // Ready: one ForkReply with index -1 (pid = the server; error = why it refuses).
  sys::Fd sigfd;
  if (interrupt) {
    sigfd = sys::Fd(::signalfd(-1, interrupt, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!sigfd) sys::throw_errno("signalfd", what);
  }
  const auto deadline = std::chrono::steady_clock::now() + ready_timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw reap("was not ready within " + std::to_string(ready_timeout.count() / 1000.0).substr(0, 5) +
                 " s (its static initialisation did not finish, or it does not link lspawn's "
                 "forkserver hook)");
    }
    pollfd pfd[2] = {{parent_end.get(), POLLIN, 0}, {sigfd.get(), POLLIN, 0}};
    const int r = ::poll(pfd, sigfd ? 2 : 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) sys::throw_errno("poll", what);
    if (sigfd && pfd[1].revents) {
      signalfd_siginfo si{};
      const ssize_t got = ::read(sigfd.get(), &si, sizeof si);
      (void)reap("interrupted");
      throw ForkserverInterrupted(got == static_cast<ssize_t>(sizeof si) ? int(si.ssi_signo) : SIGINT);
    }
    if (pfd[0].revents) break;
  }
  proto::ForkReply ready;
  try {
    wire::read_frame(parent_end.get(), ready, what.c_str());
  } catch (const std::exception&) {
    int st = 0;
    try {
      sys::waitpid(pid, &st, 0, what);
    } catch (...) {}
    std::string how = WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                                      : "exited with code " + std::to_string(WEXITSTATUS(st));
    throw SpawnError(what + " (pid " + std::to_string(pid) + ") " + how +
                     " before it was ready (does it link lspawn's runtime?)");
  }
  wire::check_version(ready.version, "ForkReply");
  if (!ready.error.empty()) throw reap("refused: " + ready.error);
  sys::set_nonblocking(exits.read.get(), what + " exit pipe");
  return std::unique_ptr<Forkserver>(new Forkserver(pid, std::move(parent_end), std::move(exits.read)));
}

std::unique_ptr<Forkserver> Forkserver::attach(pid_t pid, sys::Fd requests, sys::Fd exits) {
  sys::set_nonblocking(exits.get(), "exit pipe of forkserver (pid " + std::to_string(pid) + ")");
  std::unique_ptr<Forkserver> s(new Forkserver(pid, std::move(requests), std::move(exits)));
  s->attached_ = true;
  return s;
}

Forkserver::~Forkserver() {
  if (owner_ != ::getpid()) return;  // a forked copy: the server is not ours to stop
  requests_.reset();                 // EOF: the server kills what is left and exits
  if (attached_) {
    // Not our child: its exit pipe's EOF says it is gone (its workers killed and reaped).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{exits_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) < 0 && errno != EINTR) break;
      try {
        if (sys::read_some(exits_.get(), buf, sizeof buf, "forkserver exit pipe") == 0) break;
      } catch (...) {
        break;
      }
    }
    return;
  }
  try {
    int status;
    sys::waitpid(pid_, &status, 0, "forkserver");
  } catch (...) {}
}

pid_t Forkserver::fork_worker(const proto::SpawnCall& call, const std::vector<std::string>& env, int stdout_fd,
                              int stderr_fd) {
  proto::ForkRequest req;
  req.version = wire::kSchemaVersion;
  req.index = call.index;
  req.call = call;
  for (const auto& kv : env) req.env.push_back(kv);
  req.has_stdio = stdout_fd >= 0 && stderr_fd >= 0;
  req.cwd = worker_cwd_;
  req.umask = worker_umask_;
  const std::string context =
      "forkserver (pid " + std::to_string(pid_) + ") request for process " + std::to_string(call.index);
  const proto::ForkReply reply = request(req, stdout_fd, stderr_fd, context);
  return static_cast<pid_t>(reply.pid);
}

Forkserver::Handle Forkserver::fork_server() {
  const std::string context = "forkserver (pid " + std::to_string(pid_) + ") request for a server";
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) sys::throw_errno("socketpair", context);
  sys::Fd ours(sv[0]), theirs(sv[1]);
  sys::Pipe exits = sys::make_pipe(context + " (exit pipe)");
  proto::ForkRequest req;
  req.version = wire::kSchemaVersion;
  req.index = -1;
  req.server = true;
  const proto::ForkReply reply = request(req, theirs.get(), exits.write.get(), context);
  Handle h;
  h.pid = static_cast<pid_t>(reply.pid);
  h.requests = std::move(ours);
  h.exits = std::move(exits.read);
  return h;
}

proto::ForkReply Forkserver::request(const proto::ForkRequest& req, int a, int b, const std::string& context) {
  const int fds[2] = {a, b};
  fd_frame::write(requests_.get(), req, fds, a >= 0 && b >= 0 ? 2 : 0, context);
  proto::ForkReply reply;
  wire::read_frame(requests_.get(), reply, context.c_str());
  wire::check_version(reply.version, "ForkReply");
  if (reply.pid <= 0) {
    throw SpawnError(context + " failed: " + (reply.error.empty() ? std::string("no pid") : reply.error));
  }
  return reply;
}

std::vector<proto::ChildExit> Forkserver::read_exits(bool* server_gone) {
  if (server_gone) *server_gone = false;
  char buf[4096];
  for (;;) {
    const ssize_t n = sys::read_some(exits_.get(), buf, sizeof buf, "forkserver exit pipe");
    if (n < 0) break;  // EAGAIN
    if (n == 0) {
      if (server_gone) *server_gone = true;
      break;
    }
    exit_buf_.append(buf, static_cast<size_t>(n));
  }
  std::vector<proto::ChildExit> out;
  proto::ChildExit e;
  while (wire::try_decode_frame(exit_buf_, e, "forkserver exit pipe", 1u << 16)) {
    out.push_back(e);
  }
  return out;
}

}  // namespace lspawn
