// The guardian's main loop, shared by the lspawn-guardian program (guardian_main.cpp) and the
// fork fallback of Guardian (guardian.cpp). See guardian.hpp for the contract.
//
// Protocol on `rfd` (the only fd besides stdin/stdout/stderr the guardian keeps): int32 values,
// >0 register that pgid, <0 unregister -pgid, 0 clean shutdown (exit, nothing killed). EOF (the
// owner died, whatever killed it) SIGKILLs every registered group, then exits.
//
// Only async-signal-safe calls and no allocation: in the fork fallback this runs in a child of
// a possibly multi-threaded process. `groups` has room for `max_groups` entries.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace lspawn::guardian_detail {

// Makes this process the guardian: own process group, job-control and terminal signals
// ignored, empty signal mask, stdin/stdout on /dev/null, `rfd` moved to fd 3 and every fd
// above it closed. Returns the channel's fd (3).
inline int become_guardian(int rfd) {
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
  return rfd;
}

[[noreturn]] inline void guardian_loop(int rfd, pid_t* groups, int max_groups) {
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
    if (v == 0) ::_exit(0);
    if (v > 0) {
      if (n < max_groups) groups[n++] = v;
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

}  // namespace lspawn::guardian_detail
