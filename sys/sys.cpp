#include "sys/sys.hpp"
#include "sys/remove_tree.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <climits>
#include <unistd.h>

namespace lspawn::sys {

SysError::SysError(std::string call, int err, const std::string& context)
    : lspawn::Error(call + (context.empty() ? "" : " (" + context + ")") + ": " + std::strerror(err)),
      call_(std::move(call)),
      err_(err) {}

void throw_errno(const char* call, const std::string& context) { throw SysError(call, errno, context); }

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

void execve_or_report(const char* path, char* const argv[], char* const envp[], int status_fd) noexcept {
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

// Our own table, not glibc's sigabbrev_np (2.32): the manylinux2014 wheel runs on glibc 2.17
// (scripts/build-wheel-cross.sh). The same names sigabbrev_np gives; real-time signals by number.
// One case per signal name, in rows: clang-format would stair-step the macro calls.
// clang-format off
std::string signal_name(int sig) {
  switch (sig) {
#define LSPAWN_SIGNAL_NAME(s) \
  case s:                     \
    return #s;
    LSPAWN_SIGNAL_NAME(SIGHUP) LSPAWN_SIGNAL_NAME(SIGINT) LSPAWN_SIGNAL_NAME(SIGQUIT)
    LSPAWN_SIGNAL_NAME(SIGILL) LSPAWN_SIGNAL_NAME(SIGTRAP) LSPAWN_SIGNAL_NAME(SIGABRT)
    LSPAWN_SIGNAL_NAME(SIGBUS) LSPAWN_SIGNAL_NAME(SIGFPE) LSPAWN_SIGNAL_NAME(SIGKILL)
    LSPAWN_SIGNAL_NAME(SIGUSR1) LSPAWN_SIGNAL_NAME(SIGSEGV) LSPAWN_SIGNAL_NAME(SIGUSR2)
    LSPAWN_SIGNAL_NAME(SIGPIPE) LSPAWN_SIGNAL_NAME(SIGALRM) LSPAWN_SIGNAL_NAME(SIGTERM)
#ifdef SIGSTKFLT
    LSPAWN_SIGNAL_NAME(SIGSTKFLT)
#endif
    LSPAWN_SIGNAL_NAME(SIGCHLD) LSPAWN_SIGNAL_NAME(SIGCONT) LSPAWN_SIGNAL_NAME(SIGSTOP)
    LSPAWN_SIGNAL_NAME(SIGTSTP) LSPAWN_SIGNAL_NAME(SIGTTIN) LSPAWN_SIGNAL_NAME(SIGTTOU)
    LSPAWN_SIGNAL_NAME(SIGURG) LSPAWN_SIGNAL_NAME(SIGXCPU) LSPAWN_SIGNAL_NAME(SIGXFSZ)
    LSPAWN_SIGNAL_NAME(SIGVTALRM) LSPAWN_SIGNAL_NAME(SIGPROF) LSPAWN_SIGNAL_NAME(SIGWINCH)
    LSPAWN_SIGNAL_NAME(SIGPOLL) LSPAWN_SIGNAL_NAME(SIGPWR) LSPAWN_SIGNAL_NAME(SIGSYS)
#undef LSPAWN_SIGNAL_NAME
    default:
      return "signal " + std::to_string(sig);
  }
}
// clang-format on

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
  std::string dir(buf.data());
  if (dir[0] != '/') {  // a relative TMPDIR: absolute, so a later chdir does not lose it
    char cwd[PATH_MAX];
    if (!::getcwd(cwd, sizeof cwd)) {
      const int err = errno;
      ::rmdir(dir.c_str());
      throw SysError("getcwd", err, "making temporary directory '" + dir + "' absolute");
    }
    dir = std::string(cwd) + "/" + dir;
  }
  return dir;
}

void remove_tree(const std::string& path) { remove_tree_at(AT_FDCWD, path.c_str(), kRemoveTreeDepth); }

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

// ---- TCP sockets ----

namespace lspawn::sys {
namespace {

struct AddrInfo {
  addrinfo* res = nullptr;
  ~AddrInfo() {
    if (res) ::freeaddrinfo(res);
  }
};

void resolve(AddrInfo& ai, const std::string& addr, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &ai.res); rc != 0) {
    throw SysError("getaddrinfo", EINVAL, addr + ":" + service + ": " + ::gai_strerror(rc));
  }
}

std::string numeric(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

// "10.77.0.2:45678", "[::1]:45678".
std::string endpoint_text(const sockaddr_storage& ss) {
  int port = 0;
  if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  const std::string ip = numeric(ss);
  return (ss.ss_family == AF_INET6 && ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":" +
         std::to_string(port);
}

}  // namespace

Fd tcp_listen(const std::string& addr, int port, int* err) {
  AddrInfo ai;
  resolve(ai, addr, port, true);
  *err = 0;
  for (addrinfo* a = ai.res; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) throw_errno("socket", "listening on " + addr + ":" + std::to_string(port));
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      *err = errno;
      if (errno == EADDRINUSE || errno == EADDRNOTAVAIL) continue;
      throw_errno("bind", addr + ":" + std::to_string(port));
    }
    if (::listen(fd.get(), 128) != 0) {
      *err = errno;
      if (errno == EADDRINUSE) continue;
      throw_errno("listen", addr + ":" + std::to_string(port));
    }
    *err = 0;
    return fd;
  }
  return Fd();
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throw_errno("getsockname", "local port");
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Fd tcp_connect(const std::string& addr, int port, std::chrono::milliseconds timeout, int* err) {
  AddrInfo ai;
  resolve(ai, addr, port, false);
  const std::string ctx = "connecting to " + addr + ":" + std::to_string(port);
  *err = ECONNREFUSED;
  for (addrinfo* a = ai.res; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) throw_errno("socket", ctx);
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      int n;
      do {
        n = ::poll(&pfd, 1, static_cast<int>(std::max<long long>(timeout.count(), 0)));
      } while (n < 0 && errno == EINTR);
      if (n < 0) throw_errno("poll", ctx);
      if (n == 0) {
        *err = ETIMEDOUT;
        continue;
      }
      int so = 0;
      socklen_t len = sizeof so;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len);
      if (so != 0) {
        *err = so;
        continue;
      }
      rc = 0;
    }
    if (rc != 0) {
      *err = errno;
      switch (errno) {
        case ECONNREFUSED:
        case ETIMEDOUT:
        case ENETUNREACH:
        case EHOSTUNREACH:
        case ECONNRESET:
        case EADDRNOTAVAIL:
        case ENETDOWN: continue;
        default: throw_errno("connect", ctx);
      }
    }
    *err = 0;
    return fd;
  }
  return Fd();
}

Fd tcp_accept(int listen_fd, const std::string& context, std::string* peer) {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      if (peer) *peer = endpoint_text(ss);
      return Fd(fd);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) return Fd();
    throw_errno("accept4", context);
  }
}

namespace {
// TCP_RTO_MAX_MS (linux/tcp.h since 6.15; glibc's netinet/tcp.h does not name it yet).
#ifdef TCP_RTO_MAX_MS
constexpr int kTcpRtoMaxMs = TCP_RTO_MAX_MS;
#else
constexpr int kTcpRtoMaxMs = 44;
#endif
}  // namespace

void tcp_set_liveness(int fd, std::chrono::milliseconds timeout, const std::string& context) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    throw_errno("setsockopt(TCP_NODELAY)", context);
  unsigned ut = static_cast<unsigned>(std::max<long long>(timeout.count(), 1));
  if (::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut) != 0) {
    throw_errno("setsockopt(TCP_USER_TIMEOUT)", context);
  }
  if (::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0)
    throw_errno("setsockopt(SO_KEEPALIVE)", context);
  int idle = static_cast<int>(std::max<long long>(timeout.count() / 2000, 1));
  int intvl = std::max(idle / 2, 1), cnt = 2;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  // Retransmissions at most 1 s apart (the kernel's least), not backed off to 2, 4, 8... s: a
  // link that comes back within `timeout` carries data again within 1 s, before `timeout` runs
  // out. Linux 6.15 and later; older kernels refuse the option (ENOPROTOOPT) and back off. 1 s
  // until a round trip is measured; a connected socket has one from its handshake.
  tcp_fit_retransmission_ceiling(fd);
}

std::chrono::milliseconds tcp_retransmission_estimate(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  // No round trip measured yet (not connected): the kernel's initial variance would say 1 s.
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_rtt == 0) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::milliseconds((static_cast<long long>(ti.tcpi_rtt) + 4LL * ti.tcpi_rttvar) / 1000);
}

int tcp_fit_retransmission_ceiling(int fd) {
  const long long rto_ms = tcp_retransmission_estimate(fd).count();
  const int ceiling = static_cast<int>(std::clamp(2 * rto_ms, 1000LL, 120000LL));
  int now = 0;
  socklen_t len = sizeof now;
  if (::getsockopt(fd, IPPROTO_TCP, kTcpRtoMaxMs, &now, &len) != 0) return 0;
  if (now != ceiling && ::setsockopt(fd, IPPROTO_TCP, kTcpRtoMaxMs, &ceiling, sizeof ceiling) != 0) return 0;
  return ceiling;
}

void discard_input(int fd) {
  char sink[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    return;
  }
}

int tcp_unacknowledged(int fd) {
  int n = 0;
  return ::ioctl(fd, SIOCOUTQ, &n) == 0 ? n : -1;
}

ssize_t send_some(int fd, const char* data, size_t n, const std::string& context) {
  for (;;) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) return w;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    throw_errno("send", context);
  }
}

std::string local_ip(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throw_errno("getsockname", "local address");
  return numeric(ss);
}

std::string peer_ip(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return numeric(ss);
}

std::string peer_endpoint(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return endpoint_text(ss);
}

void send_with_fds(int sock, std::string_view data, const int* fds, size_t nfds, const std::string& context) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(nfds * sizeof(int)));
  if (nfds > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t sent;
  do {
    sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) throw_errno("sendmsg", context);
  if (static_cast<size_t>(sent) < data.size()) write_all(sock, data.substr(static_cast<size_t>(sent)), context);
}

ssize_t recv_with_fds(int sock, char* buf, size_t n, Fd* fds, size_t max_fds, const std::string& context) {
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
  iovec iov{buf, n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r;
  do {
    r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
  if (r < 0) throw_errno("recvmsg", context);
  size_t k = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (k < max_fds) {
        fds[k++].reset(fd);
      } else {
        close(fd);  // more than the protocol carries: not ours to keep
      }
    }
  }
  return r;
}

namespace {
sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    throw SysError("bind", ENAMETOOLONG,
                   "unix socket '" + path + "' (at most " + std::to_string(sizeof a.sun_path - 1) + " bytes)");
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}
}  // namespace

Fd unix_listen(const std::string& path) {
  const sockaddr_un a = unix_address(path);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) throw_errno("socket", "unix socket " + path);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) throw_errno("bind", path);
  if (::listen(fd.get(), 64) != 0) throw_errno("listen", path);
  return fd;
}

Fd unix_connect(const std::string& path, int* err) {
  const sockaddr_un a = unix_address(path);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket", "unix socket " + path);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
    if (errno == EINTR) continue;
    if (errno == ENOENT || errno == ECONNREFUSED || errno == ENOTSOCK || errno == EACCES || errno == ENOTDIR ||
        errno == EPERM) {
      *err = errno;
      return Fd();
    }
    throw_errno("connect", path);
  }
}

Fd unix_accept(int listen_fd, const std::string& context) { return tcp_accept(listen_fd, context); }

PeerCred peer_cred(int fd, const std::string& context) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) throw_errno("getsockopt(SO_PEERCRED)", context);
  return PeerCred{c.pid, c.uid, c.gid};
}

}  // namespace lspawn::sys
