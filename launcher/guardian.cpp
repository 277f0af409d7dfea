#include "launcher/guardian.hpp"

#include <cstdint>
#include <cstdio>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lspawn {
namespace {

// Protocol: int32 values. >0 register pgid, <0 unregister -pgid, 0 clean shutdown.
constexpr int32_t kShutdown = 0;

// Runs in the forked guardian child. Only async-signal-safe calls, no allocation: the group
// table was mapped before fork.
[[noreturn]] void guardian_main(int rfd, pid_t* groups) {
  ::setpgid(0, 0);
  // Ignore the job-control and terminal signals a user may send to lspawn's session; the
  // guardian ends only by EOF or a clean-shutdown message (or SIGKILL).
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP, SIGTTIN,
                SIGTTOU}) {
    ::sigaction(s, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Do not hold the owner's stdin/stdout: a reader waiting for EOF on them must not wait on us.
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::close(devnull);
  }
  // Hold nothing else of the owner's: only stderr (diagnostics) and our end of the channel.
  if (rfd != 3) {
    ::dup2(rfd, 3);
    rfd = 3;
  }
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  int n = 0;
  for (;;) {
    int32_t v;
    size_t got = 0;
    while (got < sizeof v) {
      ssize_t r = ::read(rfd, reinterpret_cast<char*>(&v) + got, sizeof v - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) goto owner_died;
      got += static_cast<size_t>(r);
    }
    if (v == kShutdown) ::_exit(0);
    if (v > 0) {
      if (n < Guardian::kMaxGroups) groups[n++] = v;
    } else {
      for (int i = 0; i < n; ++i) {
        if (groups[i] == -v) {
          groups[i] = groups[--n];
          break;
        }
      }
    }
  }
owner_died:
  for (int i = 0; i < n; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

Guardian::Guardian() {
  // A socketpair rather than a pipe: send(MSG_NOSIGNAL) never raises SIGPIPE in the owner.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    sys::throw_errno("socketpair", "guardian channel");
  }
  sys::Pipe p{sys::Fd(sv[0]), sys::Fd(sv[1])};
  const size_t bytes = sizeof(pid_t) * kMaxGroups;
  void* table = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (table == MAP_FAILED) sys::throw_errno("mmap", "guardian group table");
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::munmap(table, bytes);
    sys::throw_errno("fork", "guardian");
  }
  if (pid == 0) {
    p.write.reset();
    guardian_main(p.read.get(), static_cast<pid_t*>(table));
  }
  ::munmap(table, bytes);
  // Also set it from here so the guardian is out of our group before we return.
  ::setpgid(pid, pid);
  pid_ = pid;
  pipe_ = std::move(p.write);
}

Guardian::~Guardian() {
  try {
    shutdown();
  } catch (...) {
  }
}

void Guardian::send(int32_t value) {
  if (!pipe_) throw sys::SysError("send", EPIPE, "guardian already shut down");
  for (;;) {
    // 4 bytes on a stream socket with room: sent whole or not at all.
    ssize_t w = ::send(pipe_.get(), &value, sizeof value, MSG_NOSIGNAL);
    if (w == static_cast<ssize_t>(sizeof value)) return;
    if (w < 0 && errno == EINTR) continue;
    throw sys::SysError("send", w < 0 ? errno : EIO,
                        "guardian channel, guardian pid " + std::to_string(pid_));
  }
}

void Guardian::register_group(pid_t pgid) {
  if (pgid > 0) send(pgid);
}

void Guardian::unregister_group(pid_t pgid) {
  if (pgid > 0) send(-pgid);
}

void Guardian::shutdown() {
  if (!pipe_) return;
  try {
    send(kShutdown);
  } catch (const sys::SysError&) {
    // The guardian is gone already; nothing to tell it.
  }
  pipe_.reset();
  int status;
  try {
    sys::waitpid(pid_, &status, 0, "guardian");
  } catch (const sys::SysError&) {
    // ECHILD: someone else reaped it (a SIGCHLD handler with waitpid(-1)); nothing to do.
  }
}

}  // namespace lspawn
