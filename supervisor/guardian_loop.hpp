// The guardian's main loop, shared by the lspawn-guardian program (guardian_main.cpp) and the
// fork fallback of Guardian (guardian.cpp). See guardian.hpp for the contract.
//
// Protocol on `rfd` (the only fd besides stdin/stdout/stderr the guardian keeps): int32 values,
// >0 register that pgid, <0 unregister -pgid, 0 clean shutdown (exit, nothing killed), and
// kOwnedDir followed by an int32 length n (0 < n < PATH_MAX) and n bytes: an absolute path, the
// directory tree to remove if the owner dies (one; a later one replaces it). EOF (the owner died,
// whatever killed it) SIGKILLs every registered group, then removes that tree, then exits.
//
// Only async-signal-safe calls and no allocation: in the fork fallback this runs in a child of
// a possibly multi-threaded process. `groups` has room for `max_groups` entries.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "sys/remove_tree.hpp"

namespace lspawn::guardian_detail {

inline constexpr int32_t kOwnedDir = INT32_MIN;

// Makes this process the guardian: own process group, job-control and terminal signals
// ignored, empty signal mask, stdin/stdout on /dev/null, `rfd` moved to fd 3 and every fd
// above it closed. Returns the channel's fd (3).
inline int become_guardian(int rfd) {
  ::setpgid(0, 0);
  // Ignore the job-control and terminal signals a user may send to lspawn's session; the
  // guardian ends only by EOF or a clean-shutdown message (or SIGKILL).
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) {
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

// Reads exactly n bytes; false at EOF or on an error.
inline bool read_full(int fd, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, static_cast<char*>(buf) + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

[[noreturn]] inline void guardian_loop(int rfd, pid_t* groups, int max_groups) {
  int n = 0;
  // "" or the tree to remove when the owner dies; set only from a path read whole (a partial one
  // could name a parent of the tree).
  static char owned_dir[PATH_MAX];
  static char incoming[PATH_MAX];
  for (;;) {
    int32_t v;
    if (!read_full(rfd, &v, sizeof v)) goto owner_died;
    if (v == 0) ::_exit(0);
    if (v == kOwnedDir) {
      int32_t len;
      if (!read_full(rfd, &len, sizeof len)) goto owner_died;
      if (len <= 0 || len >= PATH_MAX) goto owner_died;  // never sent by Guardian
      if (!read_full(rfd, incoming, static_cast<size_t>(len))) goto owner_died;
      ::memcpy(owned_dir, incoming, static_cast<size_t>(len));
      owned_dir[len] = '\0';
      continue;
    }
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
  if (owned_dir[0] == '/') {
    // A worker killed in the middle of a system call may still finish it (create a file) after
    // our pass: try again, 10 ms apart, for up to 2 s.
    for (int attempt = 0; attempt < 200; ++attempt) {
      sys::remove_tree_at(AT_FDCWD, owned_dir, sys::kRemoveTreeDepth);
      if (::faccessat(AT_FDCWD, owned_dir, F_OK, AT_SYMLINK_NOFOLLOW) != 0) break;
      const struct timespec pause { 0, 10 * 1000 * 1000 };
      ::nanosleep(&pause, nullptr);
    }
  }
  ::_exit(0);
}

}  // namespace lspawn::guardian_detail
