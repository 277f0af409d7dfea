#include "launcher/spawn/fork_loop.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "launcher/sys.hpp"
#include "proto/wire.hpp"

namespace lspawn::fork_loop {
namespace {

constexpr uint32_t kMaxRequestBytes = 1u << 30;  // a request carries spawn()'s arguments

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
  wire::check_version(req.version, "ForkRequest");
  return true;
}

// In the forked worker, before it returns to its caller.
void set_up_worker(const proto::ForkRequest& req, pid_t server, const int stdio[2],
                   const sigset_t& old_mask) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != server) ::_exit(128 + SIGKILL);  // the server died between fork and prctl
  ::signal(SIGPIPE, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  if (stdio[0] >= 0) ::dup2(stdio[0], 1);
  if (stdio[1] >= 0) ::dup2(stdio[1], 2);
  if (stdio[0] > 2) sys::close(stdio[0]);
  if (stdio[1] > 2) sys::close(stdio[1]);
  if (req.env.size() > 0) {
    ::clearenv();
    for (const auto& kv : req.env) ::putenv(::strdup(kv.c_str()));  // owned by environ
  }
}

}  // namespace

proto::ForkRequest serve(int sock, int exits, pid_t owner, const RequestCheck& check) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != owner) ::_exit(0);
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
    e.version = wire::kSchemaVersion;
    e.pid = pid;
    auto it = live.find(pid);
    e.index = it == live.end() ? -1 : it->second;
    if (it != live.end()) live.erase(it);
    if (WIFSIGNALED(status)) {
      e.signal = WTERMSIG(status);
    } else {
      e.exit_code = WEXITSTATUS(status);
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
      if (!receive_request(sock, req, stdio) || req.shutdown) shutdown();
      proto::ForkReply reply;
      reply.version = wire::kSchemaVersion;
      reply.index = req.index;
      const std::string problem = check ? check(req) : std::string();
      if (!problem.empty()) {
        reply.error = problem;
      } else {
        std::fflush(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {
          sys::close(sock);
          sys::close(exits);
          sys::close(sigfd);
          set_up_worker(req, self, stdio, old_mask);
          return req;
        }
        if (pid < 0) {
          reply.error = std::string("fork: ") + std::strerror(errno);
        } else {
          ::setpgid(pid, pid);  // also in the child: whichever runs first, no window
          live[pid] = req.index;
          reply.pid = pid;
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

}  // namespace lspawn::fork_loop
