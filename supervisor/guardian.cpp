#include "supervisor/guardian.hpp"
#include "supervisor/install_layout.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "supervisor/guardian_loop.hpp"

extern char** environ;

namespace lspawn {
namespace {

constexpr int32_t kShutdown = 0;  // protocol: guardian_loop.hpp

// posix_spawn of `program` with `channel` as its fd 3, in a new process group. Returns the pid,
// or -1 (errno set) when it could not be started.
pid_t spawn_program(const std::string& program, int channel) {
  // adddup2(fd, fd) would leave O_CLOEXEC set on older C libraries: make sure they differ.
  sys::Fd moved;
  if (channel == 3) {
    const int fd = ::fcntl(channel, F_DUPFD_CLOEXEC, 4);
    if (fd < 0) return -1;
    moved.reset(fd);
    channel = fd;
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&fa) != 0) return -1;
  if (posix_spawnattr_init(&attr) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    return -1;
  }
  int rc = posix_spawn_file_actions_adddup2(&fa, channel, 3);
  // A new process group, an empty signal mask (the owner may have everything blocked while it
  // forks workers) and default dispositions; guardian_main then ignores what it must.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  sigdelset(&all, SIGKILL);
  sigdelset(&all, SIGSTOP);
  if (rc == 0)
    rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (rc == 0) rc = posix_spawnattr_setpgroup(&attr, 0);
  if (rc == 0) rc = posix_spawnattr_setsigmask(&attr, &none);
  if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
  pid_t pid = -1;
  if (rc == 0) {
    char* const argv[] = {const_cast<char*>("lspawn-guardian"), nullptr};
    rc = ::posix_spawn(&pid, program.c_str(), &fa, &attr, argv, environ);
  }
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

bool executable(const char* path) { return path && *path && ::access(path, X_OK) == 0; }

}  // namespace

std::string Guardian::find_program() {
  if (const char* env = std::getenv("LSPAWN_GUARDIAN")) return executable(env) ? env : "";
  // Beside the running program (install tree, wheel, build tree: install_layout.hpp).
  const std::string found = layout::find(layout::Helper::Guardian);
  return executable(found.c_str()) ? found : "";
}

Guardian::Guardian() {
  // A socketpair rather than a pipe: send(MSG_NOSIGNAL) never raises SIGPIPE in the owner.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    sys::throw_errno("socketpair", "guardian channel");
  }
  sys::Pipe p{sys::Fd(sv[0]), sys::Fd(sv[1])};

  const std::string program = find_program();
  pid_t pid = program.empty() ? -1 : spawn_program(program, p.read.get());
  if (pid > 0) {
    program_ = program;
  } else {
    // Fork fallback: the group table is mapped before fork, so the child never allocates.
    const size_t bytes = sizeof(pid_t) * kMaxGroups;
    void* table = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED) sys::throw_errno("mmap", "guardian group table");
    std::fflush(nullptr);
    pid = ::fork();
    if (pid < 0) {
      ::munmap(table, bytes);
      sys::throw_errno("fork", "guardian");
    }
    if (pid == 0) {
      p.write.reset();
      const int rfd = guardian_detail::become_guardian(p.read.get());
      guardian_detail::guardian_loop(rfd, static_cast<pid_t*>(table), kMaxGroups);
    }
    ::munmap(table, bytes);
    // Also set it from here so the guardian is out of our group before we return.
    ::setpgid(pid, pid);
  }
  pid_ = pid;
  pipe_ = std::move(p.write);
}

Guardian::~Guardian() {
  try {
    shutdown();
  } catch (...) {}
}

void Guardian::send(int32_t value) { send_bytes(&value, sizeof value); }

void Guardian::send_bytes(const void* data, size_t n) {
  if (!pipe_) throw sys::SysError("send", EPIPE, "guardian already shut down");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(pipe_.get(), p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      throw sys::SysError("send", w < 0 ? errno : EIO, "guardian channel, guardian pid " + std::to_string(pid_));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void Guardian::remove_on_owner_death(const std::string& dir) {
  if (dir.empty() || dir[0] != '/' || dir.size() >= PATH_MAX || dir.find('\0') != std::string::npos) {
    throw std::invalid_argument(
        "guardian: the directory to remove if the owner dies must be an absolute path "
        "shorter than PATH_MAX, got '" +
        dir + "'");
  }
  // One message: the guardian reads the stream in order and keeps the path only once it is whole.
  std::string msg(2 * sizeof(int32_t), '\0');
  const int32_t tag = guardian_detail::kOwnedDir;
  const auto len = static_cast<int32_t>(dir.size());
  std::memcpy(msg.data(), &tag, sizeof tag);
  std::memcpy(msg.data() + sizeof tag, &len, sizeof len);
  msg += dir;
  send_bytes(msg.data(), msg.size());
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
