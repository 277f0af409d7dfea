#include "spawn/fork_loop.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "sys/child_setup.hpp"
#include "sys/fd_frame.hpp"
#include "sys/sys.hpp"
#include "proto/wire.hpp"
#include "placement/cpu_list.hpp"
#include "supervisor/env_contract.hpp"

namespace lspawn::fork_loop {
namespace {

constexpr uint32_t kMaxRequestBytes = 1u << 30;  // a request carries spawn()'s arguments

// Receives one ForkRequest frame with up to two SCM_RIGHTS fds. False on EOF.
bool receive_request(int sock, proto::ForkRequest& req, int fds[2]) {
  sys::Fd got[2];
  if (!fd_frame::read(sock, req, got, 2, kMaxRequestBytes, "forkserver request")) return false;
  wire::check_version(req.version, "ForkRequest");
  fds[0] = got[0].release();
  fds[1] = got[1].release();
  return true;
}

// In the forked worker, before it returns to its caller.
void set_up_worker(const proto::ForkRequest& req, pid_t server, const int stdio[2], const sigset_t& old_mask) {
  sys::child_setup(server);
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
  if (req.umask >= 0) ::umask(static_cast<mode_t>(req.umask & 0777));
  // --numa-binding: the CPUs the launcher placed this worker on (env_contract.hpp), as an exec'd
  // worker gets them before its exec.
  if (const char* cpus = ::getenv(env::kLspawnCpus)) {
    try {
      const placement::CpuList list = placement::parse_cpu_list(cpus, env::kLspawnCpus);
      if (!list.empty() && placement::set_affinity(list) != 0) throw std::invalid_argument(std::strerror(errno));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lspawn forkserver: worker %d (pid %d): cannot run on the CPUs %s=%s: %s\n",
                   static_cast<int>(req.index), static_cast<int>(::getpid()), env::kLspawnCpus, cpus, e.what());
      std::fflush(stderr);
      ::_exit(126);
    }
  }
  if (!req.cwd.empty() && ::chdir(req.cwd.c_str()) != 0) {
    std::fprintf(stderr, "lspawn forkserver: worker %d (pid %d): cannot change to the directory '%s': %s\n",
                 static_cast<int>(req.index), static_cast<int>(::getpid()), req.cwd.c_str(), std::strerror(errno));
    std::fflush(stderr);
    ::_exit(126);
  }
}

// In a forked server (ForkRequest::server), before it serves: its own process group, killed
// with the server that forked it, the caller's signal mask back (serve() blocks SIGCHLD again).
void set_up_server(pid_t parent, const sigset_t& old_mask) {
  sys::child_setup(parent);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
}

// A pidfd of `pid` (Linux 5.3+; -1 otherwise): readable once the child has exited, whichever
// thread the kernel hands the SIGCHLD to. A server runs threads of its own when a preloaded module
// started some (LSPAWN_PRELOAD_ALLOW_THREADS=1): they do not block SIGCHLD, so it may be given to
// one of them and never reach the signalfd (seen: a worker's exit went unreported, the run hung).
int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

proto::ForkRequest serve(int sock, int exits, pid_t owner, const RequestCheck& check, const ForkHooks& hooks) {
  sys::child_setup(owner, SIGKILL, sys::ChildGroup::kInherit);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t chld, old_mask;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, &old_mask);
  const int sigfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  const pid_t self = ::getpid();
  std::map<pid_t, int> live;    // worker pid -> index
  std::map<pid_t, int> pidfds;  // worker pid -> its pidfd (open_pidfd); a live worker without one
                                // makes the loop poll the children every 100 ms too

  auto report_exit = [&](pid_t pid, int status) {
    proto::ChildExit e;
    e.version = wire::kSchemaVersion;
    e.pid = pid;
    auto it = live.find(pid);
    e.index = it == live.end() ? -1 : it->second;
    if (it != live.end()) live.erase(it);
    if (auto fd = pidfds.find(pid); fd != pidfds.end()) {
      sys::close(fd->second);
      pidfds.erase(fd);
    }
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
    std::vector<pollfd> pfd;
    for (;;) {
      pfd.assign({{sock, POLLIN, 0}, {sigfd, POLLIN, 0}});
      for (const auto& [pid, fd] : pidfds) pfd.push_back({fd, POLLIN, 0});
      const int n = ::poll(pfd.data(), pfd.size(), live.size() > pidfds.size() ? 100 : -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) shutdown();
      const bool child_event =
          n == 0 || std::any_of(pfd.begin() + 1, pfd.end(), [](const pollfd& p) { return p.revents != 0; });
      if (child_event) {
        signalfd_siginfo si;
        while (::read(sigfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {}
        reap();
      }
      if (!pfd[0].revents) continue;
      proto::ForkRequest req;
      int stdio[2];
      if (!receive_request(sock, req, stdio) || req.shutdown) shutdown();
      proto::ForkReply reply;
      reply.version = wire::kSchemaVersion;
      reply.index = req.index;
      std::string problem = check && !req.server ? check(req) : std::string();
      if (req.server && (stdio[0] < 0 || stdio[1] < 0)) {
        problem = "a request for a server must carry its request socket and exit pipe";
      }
      if (!problem.empty()) {
        reply.error = problem;
      } else {
        std::fflush(nullptr);
        if (hooks.before) hooks.before();
        const pid_t pid = ::fork();
        if (pid != 0 && hooks.parent) hooks.parent();
        if (pid == 0) {
          sys::close(sock);
          sys::close(exits);
          sys::close(sigfd);
          for (const auto& [other, fd] : pidfds) sys::close(fd);
          if (req.server) {
            // A server of its own, on the fds the request carried; its workers return from here.
            set_up_server(self, old_mask);
            if (hooks.child) hooks.child();
            return serve(stdio[0], stdio[1], self, check, hooks);
          }
          set_up_worker(req, self, stdio, old_mask);
          if (hooks.child) hooks.child();
          return req;
        }
        if (pid < 0) {
          reply.error = std::string("fork: ") + std::strerror(errno);
        } else {
          ::setpgid(pid, pid);  // also in the child: whichever runs first, no window
          live[pid] = req.index;
          if (const int fd = open_pidfd(pid); fd >= 0) pidfds[pid] = fd;
          reply.pid = pid;
        }
      }
      if (stdio[0] >= 0) sys::close(stdio[0]);
      if (stdio[1] >= 0) sys::close(stdio[1]);
      wire::write_frame(sock, reply, "forkserver reply");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lspawn forkserver (pid %d): %s; stopping its workers\n", static_cast<int>(self), e.what());
    shutdown();
  }
  ::_exit(0);  // not reached: shutdown() exits
}

}  // namespace lspawn::fork_loop
