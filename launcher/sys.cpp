#include "launcher/sys.hpp"

#include <cstdlib>
#include <cstring>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace lspawn::sys {

SysError::SysError(std::string call, int err, const std::string& context)
    : std::runtime_error(call + (context.empty() ? "" : " (" + context + ")") + ": " +
                         std::strerror(err)),
      call_(std::move(call)),
      err_(err) {}

void throw_errno(const char* call, const std::string& context) {
  throw SysError(call, errno, context);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

Fd::~Fd() { reset(); }

void Fd::reset(int fd) {
  if (fd_ >= 0) sys::close(fd_);
  fd_ = fd;
}

Pipe make_pipe(const std::string& context, int extra_flags) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | extra_flags) != 0) throw_errno("pipe2", context);
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

void execve_or_report(const char* path, char* const argv[], char* const envp[],
                      int status_fd) noexcept {
  ::execve(path, argv, envp);
  const int e = errno;
  (void)!::write(status_fd, &e, sizeof e);
  ::_exit(e == ENOENT ? 127 : 126);
}

int read_exec_errno(int status_read_fd) {
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(status_read_fd, &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(sizeof exec_errno) ? exec_errno : 0;
}

void close(int fd) {
  if (fd >= 0) ::close(fd);
}

void set_nonblocking(int fd, const std::string& context) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) throw_errno("fcntl(F_GETFL)", context);
  if (::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) throw_errno("fcntl(F_SETFL)", context);
}

void write_all(int fd, std::string_view data, const std::string& context) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // Someone made this fd non-blocking (a shared terminal or pipe): wait until writable.
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, -1) < 0 && errno != EINTR) throw_errno("poll", context);
        continue;
      }
      throw_errno("write", context);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

ssize_t read_some(int fd, char* buf, size_t n, const std::string& context) {
  for (;;) {
    ssize_t r = ::read(fd, buf, n);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    throw_errno("read", context);
  }
}

bool kill(pid_t pid, int sig, const std::string& context) {
  if (::kill(pid, sig) == 0) return true;
  if (errno == ESRCH) return false;
  throw SysError("kill(" + std::to_string(pid) + ", " + signal_name(sig) + ")", errno, context);
}

pid_t waitpid(pid_t pid, int* status, int options, const std::string& context) {
  for (;;) {
    pid_t r = ::waitpid(pid, status, options);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    throw SysError("waitpid(" + std::to_string(pid) + ")", errno, context);
  }
}

Fd pidfd_open(pid_t pid, const std::string& context) {
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) throw SysError("pidfd_open(" + std::to_string(pid) + ")", errno, context);
  // pidfds are always close-on-exec.
  return Fd(static_cast<int>(fd));
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) return "terminated with signal " + signal_name(WTERMSIG(status));
  const int code = WEXITSTATUS(status);
  if (code == 0) return "exited with code 0";
  return "terminated with exit code " + std::to_string(code);
}

int shell_exit_code(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

std::string make_temp_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw_errno("mkdtemp", tmpl);
  return std::string(buf.data());
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = ::opendir(path.c_str())) {
      while (struct dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
        remove_tree(path + "/" + e->d_name);
      }
      ::closedir(d);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

std::string hostname() {
  char buf[256];
  if (::gethostname(buf, sizeof buf) != 0) return "unknown";
  buf[sizeof buf - 1] = '\0';
  return buf;
}

namespace {
// 0 when `path` can be executed, else the errno execve would give.
int check_exec(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EACCES;
  if (::access(path.c_str(), X_OK) != 0) return errno;
  return 0;
}
}  // namespace

std::optional<std::string> find_executable(const std::string& file, int* err) {
  if (file.empty()) {
    *err = ENOENT;
    return std::nullopt;
  }
  if (file.find('/') != std::string::npos) {
    int e = check_exec(file);
    if (e == 0) return file;
    *err = e;
    return std::nullopt;
  }
  const char* p = std::getenv("PATH");
  std::string path = p ? p : "/usr/local/bin:/usr/bin:/bin";
  int first_err = ENOENT;
  size_t start = 0;
  for (;;) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + file;
    int e = check_exec(cand);
    if (e == 0) return cand;
    // Like execvp: remember that a candidate existed but was not executable.
    if (e == EACCES && first_err == ENOENT) first_err = EACCES;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  *err = first_err;
  return std::nullopt;
}

void make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0) throw_errno("mkdir", path);
}

Fd open_directory_handle(const std::string& path) {
  const int fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("open", path);
  return Fd(fd);
}

}  // namespace lspawn::sys
