#include "launcher/spawn/forkserver.hpp"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "launcher/spawn/errors.hpp"
#include "launcher/spawn/init.hpp"
#include "launcher/spawn/registry.hpp"
#include "launcher/spawn/threads.hpp"
#include "launcher/spawn/worker.hpp"
#include "proto/wire.hpp"

namespace lspawn {
namespace {

constexpr uint32_t kMaxRequestBytes = 1u << 30;  // a request carries the arguments

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

// Reads exactly n bytes; false on EOF before the first byte; throws on a truncated read.
bool read_exact(int fd, char* p, size_t n, const char* what) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = sys::read_some(fd, p + got, n - got, what);
    if (r == 0) {
      if (got == 0) return false;
      throw wire::WireError(std::string(what) + ": truncated frame");
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

// Receives one ForkRequest frame with up to two SCM_RIGHTS fds. False on EOF.
bool receive_request(int sock, proto::ForkRequest& req, int fds[2]) {
  fds[0] = fds[1] = -1;
  char hdr[4];
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  iovec iov{hdr, sizeof hdr};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r;
  do {
    r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) sys::throw_errno("recvmsg", "forkserver request");
  if (r == 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      std::memcpy(fds, CMSG_DATA(c), std::min<size_t>(n, 2) * sizeof(int));
    }
  }
  if (r < 4 && !read_exact(sock, hdr + r, 4 - static_cast<size_t>(r), "forkserver request")) {
    throw wire::WireError("forkserver request: truncated frame header");
  }
  std::string frame(hdr, 4);
  const uint32_t len = uint32_t(uint8_t(hdr[0])) | uint32_t(uint8_t(hdr[1])) << 8 |
                       uint32_t(uint8_t(hdr[2])) << 16 | uint32_t(uint8_t(hdr[3])) << 24;
  if (len > kMaxRequestBytes) {
    throw wire::WireError("forkserver request: frame of " + std::to_string(len) +
                          " bytes exceeds the bound");
  }
  frame.resize(4 + size_t(len));
  if (len > 0 && !read_exact(sock, frame.data() + 4, len, "forkserver request")) {
    throw wire::WireError("forkserver request: truncated frame");
  }
  if (!wire::try_decode_frame(frame, req, "forkserver request", kMaxRequestBytes)) {
    throw wire::WireError("forkserver request: incomplete frame");
  }
  wire::check_version(req.version(), "ForkRequest");
  return true;
}

[[noreturn]] void run_forked_worker(const proto::ForkRequest& req, const Invoker& invoker,
                                    pid_t server, int stdio[2], const sigset_t& old_mask) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != server) ::_exit(1);  // the server died between fork and prctl
  ::signal(SIGPIPE, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (stdio[0] >= 0) ::dup2(stdio[0], 1);
  if (stdio[1] >= 0) ::dup2(stdio[1], 2);
  if (stdio[0] > 2) sys::close(stdio[0]);
  if (stdio[1] > 2) sys::close(stdio[1]);
  if (req.env_size() > 0) {
    ::clearenv();
    for (const auto& kv : req.env()) ::putenv(::strdup(kv.c_str()));  // owned by environ
  }
  const proto::SpawnCall& call = req.call();
  WorkerBody body;
  body.index = call.index();
  body.nprocs = call.nprocs();
  body.result_path = call.want_result() ? call.result_path() : std::string();
  if (const char* ef = std::getenv("TORCHELASTIC_ERROR_FILE")) body.error_file = ef;
  body.call = [&] { return invoker(call.index(), call.args()); };
  const int code = run_worker(body);
  std::fflush(nullptr);
  ::_exit(code);
}

[[noreturn]] void serve(int sock, int exits, pid_t owner) noexcept {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != owner) ::_exit(0);
  close_all_fds_except({sock, exits});
  reset_signal_handlers();  // the owner's handlers (e.g. a test framework's) are not ours
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t chld, old_mask;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, &old_mask);
  const int sigfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  const pid_t self = ::getpid();
  std::map<pid_t, int> live;  // worker pid -> index

  auto report_exit = [&](pid_t pid, int status) {
    proto::ChildExit e;
    e.set_version(wire::kSchemaVersion);
    e.set_pid(pid);
    auto it = live.find(pid);
    e.set_index(it == live.end() ? -1 : it->second);
    if (it != live.end()) live.erase(it);
    if (WIFSIGNALED(status)) {
      e.set_signal(WTERMSIG(status));
    } else {
      e.set_exit_code(WEXITSTATUS(status));
    }
    try {
      wire::write_frame(exits, e, "forkserver exit pipe");
    } catch (...) {
      // The owner is gone; shutdown follows on the request socket's EOF.
    }
  };
  auto reap = [&] {
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) report_exit(pid, status);
  };
  auto shutdown = [&]() {
    for (const auto& [pid, index] : live) ::kill(-pid, SIGKILL);
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, 0)) > 0 || (pid < 0 && errno == EINTR)) {
      if (pid > 0) report_exit(pid, status);
    }
    ::_exit(0);
  };

  try {
    for (;;) {
      pollfd pfd[2] = {{sock, POLLIN, 0}, {sigfd, POLLIN, 0}};
      const int n = ::poll(pfd, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) shutdown();
      if (pfd[1].revents) {
        signalfd_siginfo si;
        while (::read(sigfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        }
        reap();
      }
      if (!pfd[0].revents) continue;
      proto::ForkRequest req;
      int stdio[2];
      if (!receive_request(sock, req, stdio) || req.shutdown()) shutdown();
      proto::ForkReply reply;
      reply.set_version(wire::kSchemaVersion);
      reply.set_index(req.index());
      const Invoker* invoker = FunctionRegistry::global().find(req.call().function());
      if (!invoker) {
        reply.set_error("function '" + req.call().function() +
                        "' is not registered in the forkserver's program (LSPAWN_REGISTER); "
                        "registered: " + FunctionRegistry::global().names());
      } else {
        std::fflush(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {
          sys::close(sock);
          sys::close(exits);
          sys::close(sigfd);
          run_forked_worker(req, *invoker, self, stdio, old_mask);
        }
        if (pid < 0) {
          reply.set_error(std::string("fork: ") + std::strerror(errno));
        } else {
          ::setpgid(pid, pid);  // also in the child: whichever runs first, no window
          live[pid] = req.index();
          reply.set_pid(pid);
        }
      }
      if (stdio[0] >= 0) sys::close(stdio[0]);
      if (stdio[1] >= 0) sys::close(stdio[1]);
      wire::write_frame(sock, reply, "forkserver reply");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lspawn forkserver (pid %d): %s; stopping its workers\n",
                 static_cast<int>(self), e.what());
    shutdown();
  }
  ::_exit(0);  // not reached: shutdown() exits
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
  return std::unique_ptr<Forkserver>(
      new Forkserver(pid, std::move(parent_end), std::move(exits.read)));
}

Forkserver::~Forkserver() {
  if (owner_ != ::getpid()) return;  // a forked copy: the server is not ours to stop
  requests_.reset();  // EOF: the server kills what is left and exits
  try {
    int status;
    sys::waitpid(pid_, &status, 0, "forkserver");
  } catch (...) {
  }
}

pid_t Forkserver::fork_worker(const proto::SpawnCall& call, const std::vector<std::string>& env,
                              int stdout_fd, int stderr_fd) {
  proto::ForkRequest req;
  req.set_version(wire::kSchemaVersion);
  req.set_index(call.index());
  *req.mutable_call() = call;
  for (const auto& kv : env) req.add_env(kv);
  const bool has_stdio = stdout_fd >= 0 && stderr_fd >= 0;
  req.set_has_stdio(has_stdio);
  const std::string frame = wire::encode_frame(req);
  const std::string context = "forkserver (pid " + std::to_string(pid_) + ") request for process " +
                              std::to_string(call.index());

  iovec iov{const_cast<char*>(frame.data()), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (has_stdio) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    const int fds[2] = {stdout_fd, stderr_fd};
    std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  }
  ssize_t sent;
  do {
    sent = ::sendmsg(requests_.get(), &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) sys::throw_errno("sendmsg", context);
  if (static_cast<size_t>(sent) < frame.size()) {
    sys::write_all(requests_.get(), std::string_view(frame).substr(static_cast<size_t>(sent)),
                   context);
  }
  proto::ForkReply reply;
  wire::read_frame(requests_.get(), reply, context.c_str());
  wire::check_version(reply.version(), "ForkReply");
  if (reply.pid() <= 0) {
    throw SpawnError(context + " failed: " +
                     (reply.error().empty() ? std::string("no pid") : reply.error()));
  }
  return static_cast<pid_t>(reply.pid());
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
