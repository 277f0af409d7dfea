#include "status/stack_dump.hpp"

#include <cerrno>
#include <cstring>

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lspawn::status {
namespace {

constexpr int kMaxFrames = 128;
constexpr std::size_t kPathBytes = 4096;

// Written once by install_stack_dump before the handler is installed; read by the handler only.
char g_path[kPathBytes];
char g_tmp[kPathBytes];

void write_str(int fd, const char* s) {
  std::size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Decimal without stdio (async-signal-safe).
void write_num(int fd, long v) {
  char buf[24];
  int i = sizeof buf;
  buf[--i] = '\0';
  const bool neg = v < 0;
  unsigned long u = neg ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u && i > 1);
  if (neg) buf[--i] = '-';
  write_str(fd, buf + i);
}

void on_stack_signal(int sig, siginfo_t*, void*) {
  const int saved = errno;
  const pid_t pid = ::getpid();
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  if (tid != pid) {  // not the main thread: hand the request to it
    ::syscall(SYS_tgkill, pid, pid, sig);
    errno = saved;
    return;
  }
  void* frames[kMaxFrames];
  const int n = ::backtrace(frames, kMaxFrames);
  const int fd = ::open(g_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    write_str(fd, "pid ");
    write_num(fd, pid);
    write_str(fd, " main thread\n");
    // frames[0] is this handler, frames[1] the signal trampoline (__restore_rt): start at the
    // function the signal interrupted.
    if (n > 2) ::backtrace_symbols_fd(frames + 2, n - 2, fd);
    write_str(fd, kStackEnd);
    write_str(fd, "\n");
    ::close(fd);
    ::rename(g_tmp, g_path);
  }
  errno = saved;
}

}  // namespace

bool install_stack_dump(const std::string& path) {
  struct sigaction old {};
  if (::sigaction(kStackSignal, nullptr, &old) != 0) return false;
  const bool ours = (old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_stack_signal;
  if (!ours && (old.sa_flags & SA_SIGINFO ? old.sa_sigaction != nullptr : old.sa_handler != SIG_DFL)) return false;
  if (path.size() + 8 >= kPathBytes) return false;
  void* warm[2];
  ::backtrace(warm, 2);  // loads libgcc_s now, outside any signal handler
  // Block while the paths change so a handler never reads a half-written one.
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, kStackSignal);
  ::pthread_sigmask(SIG_BLOCK, &block, nullptr);
  std::memcpy(g_path, path.c_str(), path.size() + 1);
  std::memcpy(g_tmp, path.c_str(), path.size());
  std::memcpy(g_tmp + path.size(), ".tmp", 5);
  struct sigaction sa {};
  sa.sa_sigaction = on_stack_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  const bool ok = ::sigaction(kStackSignal, &sa, nullptr) == 0;
  ::pthread_sigmask(SIG_UNBLOCK, &block, nullptr);
  return ok;
}

}  // namespace lspawn::status
