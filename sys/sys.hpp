// Every system call the launcher makes, wrapped once.
//
// Guarantees of every wrapper here:
//   - EINTR is retried (except where the caller must see it, none so far);
//   - a failure throws SysError naming the call, errno text and the caller's context string
//     (e.g. "kill(-1234, SIGTERM) for rank 3: Operation not permitted");
//   - every fd created is O_CLOEXEC.
// Calls whose failure is an expected outcome return it instead of throwing (documented per call).
//
// Code in the torch-free parts (supervisor/ … launcher/) does not call close/kill/waitpid/pipe directly.
#pragma once

#include <cerrno>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <sys/types.h>

#include "proto/error.hpp"

namespace lspawn::sys {

// A failed system call: `call` (e.g. "waitpid"), the errno value and the caller's context.
class SysError : public lspawn::Error {
 public:
  SysError(std::string call, int err, const std::string& context);
  const std::string& call() const { return call_; }
  int error() const { return err_; }

 private:
  std::string call_;
  int err_;
};

// Throws SysError(call, errno, context). For wrappers outside this file.
[[noreturn]] void throw_errno(const char* call, const std::string& context);

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read;
  Fd write;
};

// pipe2(O_CLOEXEC | extra_flags).
Pipe make_pipe(const std::string& context, int extra_flags = 0);

// close(2); EINTR is not retried (Linux closes the fd anyway). Errors other than EBADF ignored.
void close(int fd);

// Sets O_NONBLOCK on fd.
void set_nonblocking(int fd, const std::string& context);

// write(2) of all of `data`, retrying EINTR and short writes (and waiting with poll when the fd
// is non-blocking and full). Throws SysError (EPIPE included).
void write_all(int fd, std::string_view data, const std::string& context);

// read(2) once, retrying EINTR. Returns bytes read (0 = EOF), or -1 with errno EAGAIN when a
// non-blocking fd has nothing. Other errors throw.
ssize_t read_some(int fd, char* buf, size_t n, const std::string& context);

// kill(2). Returns false when the target no longer exists (ESRCH); other errors throw.
// pid < 0 addresses a process group.
bool kill(pid_t pid, int sig, const std::string& context);

// waitpid(pid, &status, options), EINTR retried. Returns the pid reaped, or 0 with WNOHANG
// when the child has not changed state. Throws on error (ECHILD included).
pid_t waitpid(pid_t pid, int* status, int options, const std::string& context);

// pidfd_open(2): an fd that polls readable when `pid` exits. Linux >= 5.3.
Fd pidfd_open(pid_t pid, const std::string& context);

// "SIGTERM" for SIGTERM, "signal 42" for numbers without a name.
std::string signal_name(int sig);

// Describes a wait status the way torch.multiprocessing does, after "process N ":
// "terminated with exit code 3", "terminated with signal SIGSEGV", "exited with code 0".
std::string describe_wait_status(int status);

// Exit status a shell would report for a wait status: the code, or 128+signal.
int shell_exit_code(int status);

// The exec handshake of a forked child, so that the parent knows the exec's outcome when it
// returns. In the child: execve(path, argv, envp); when that fails, writes its errno to
// `status_fd` (the write end of a close-on-exec pipe: on success the parent reads EOF) and
// _exits with the code a shell gives (127 not found, 126 otherwise). Async-signal-safe.
[[noreturn]] void execve_or_report(const char* path, char* const argv[], char* const envp[], int status_fd) noexcept;
// In the parent, after closing its copy of the write end: reads the pipe to EOF. Returns 0
// when the exec succeeded, else the child's execve errno.
int read_exec_errno(int status_read_fd);

// mkdtemp under $TMPDIR (or /tmp) with the given name prefix. Returns the directory's absolute
// path (a relative TMPDIR is taken from the current directory).
std::string make_temp_dir(const std::string& prefix);

// Removes a directory tree, or a file (best effort, errors ignored; links removed, never
// followed; kRemoveTreeDepth levels deep at most: remove_tree.hpp). Used for lspawn's private
// run dir.
void remove_tree(const std::string& path);

// gethostname(2), "unknown" on failure.
std::string hostname();

// Searches `file` like execvp: a name with '/' is used as is; otherwise each directory of
// $PATH (default "/usr/local/bin:/usr/bin:/bin") is tried. Returns the resolved path; on
// failure returns nullopt and sets *err to the errno a shell would report (ENOENT when not
// found anywhere, EACCES when found but not executable, ...).
std::optional<std::string> find_executable(const std::string& file, int* err);

// ---- TCP sockets: the launchers' control channel between nodes (cluster/node_channel.hpp) ----
// Every socket is O_CLOEXEC and non-blocking. `addr` is a numeric IPv4/IPv6 address or a host
// name (getaddrinfo; the first address that works is used).

// A listening socket bound to addr:port (SO_REUSEADDR, backlog 128). Returns an invalid Fd and
// sets *err when the address is not this host's (EADDRNOTAVAIL) or the port is taken
// (EADDRINUSE): expected outcomes for "am I the rendezvous host?". Other failures throw.
Fd tcp_listen(const std::string& addr, int port, int* err);
// The port a bound socket got (for port 0).
int local_port(int fd);
// Connects to addr:port within `timeout`. Returns an invalid Fd and sets *err when the peer is
// not there (yet): ECONNREFUSED, ETIMEDOUT, ENETUNREACH, EHOSTUNREACH, ECONNRESET. An
// unresolvable name throws SysError("getaddrinfo", EINVAL, ...).
Fd tcp_connect(const std::string& addr, int port, std::chrono::milliseconds timeout, int* err);
// accept4 on a non-blocking listening socket: an invalid Fd when nothing is pending. `peer`, when
// given, gets the client's endpoint as peer_endpoint() spells it (known even when the client has
// already reset the connection).
Fd tcp_accept(int listen_fd, const std::string& context, std::string* peer = nullptr);
// TCP_NODELAY, and a dead peer noticed within `timeout`: TCP_USER_TIMEOUT (unacknowledged data)
// and keepalive probes (an idle connection). Retransmissions at most 1 s apart (TCP_RTO_MAX_MS,
// Linux 6.15+; ignored where the kernel lacks it), so that a link back within `timeout` carries
// data again within a second rather than after the next doubled back-off (docs/multi-node.md,
// "Partitions").
void tcp_set_liveness(int fd, std::chrono::milliseconds timeout, const std::string& context);
// The retransmission ceiling of tcp_set_liveness fitted to the connection's measured round trip
// (TCP_INFO): 2 x (smoothed RTT + 4 x its variance), at least 1 s, at most 120 s. Below a round
// trip the 1 s ceiling resends every segment before its ACK can come, the connection always has
// resent data outstanding, and TCP_USER_TIMEOUT ends a link that works (2 s one way; docs/
// reliability.md, "Slow and lossy links"). Returns the ceiling in ms, 0 where the kernel has no
// TCP_RTO_MAX_MS or the socket no TCP_INFO. Called as the heartbeats go (cluster/links.hpp).
int tcp_fit_retransmission_ceiling(int fd);
// The kernel's retransmission timeout for the connection's measured round trip, before any
// back-off (TCP_INFO: smoothed RTT + 4 x its variance), in whole ms; 0 before a round trip was
// measured (and on loopback, where it is microseconds).
std::chrono::milliseconds tcp_retransmission_estimate(int fd);
// The kernel's count of bytes sent on a TCP socket and not yet acknowledged by the peer, plus
// those not yet sent (SIOCOUTQ); -1 when it cannot tell.
int tcp_unacknowledged(int fd);
// Reads and drops what a non-blocking socket holds now (errors and end of stream ignored): a
// socket closed with unread bytes sends a reset, which can overtake what it sent last.
void discard_input(int fd);
// send(2) once, MSG_NOSIGNAL | MSG_DONTWAIT. Returns bytes sent, or -1 when the socket buffer is
// full (EAGAIN). Other errors (EPIPE, ECONNRESET, ETIMEDOUT...) throw.
ssize_t send_some(int fd, const char* data, size_t n, const std::string& context);
// The numeric address of this end / the other end of a connected socket ("10.77.0.2").
std::string local_ip(int fd);
std::string peer_ip(int fd);
// "10.77.0.2:45678" ("[::1]:45678" for IPv6): the other end of a connected TCP socket.
std::string peer_endpoint(int fd);

// ---- unix sockets: the forkserver protocol and the warm daemon (docs/warm-start.md) ----

// sendmsg(2) of `data` with `fds` attached (SCM_RIGHTS, with its first bytes), MSG_NOSIGNAL;
// what one sendmsg did not take is written with write_all. Throws SysError (EPIPE included).
void send_with_fds(int sock, std::string_view data, const int* fds, size_t nfds, const std::string& context);
// recvmsg(2) once into buf, EINTR retried, MSG_CMSG_CLOEXEC. The fds that came with the bytes
// are stored in fds[0..max_fds) (the others unset; extra ones are closed). Returns bytes read
// (0 = EOF), or -1 with errno EAGAIN on a non-blocking socket with nothing. Other errors throw.
ssize_t recv_with_fds(int sock, char* buf, size_t n, Fd* fds, size_t max_fds, const std::string& context);
// A listening unix stream socket at `path` (O_CLOEXEC, non-blocking, backlog 64). Throws.
Fd unix_listen(const std::string& path);
// Connects to the unix stream socket at `path` (blocking, O_CLOEXEC). Returns an invalid Fd and
// sets *err when nobody listens there (ENOENT, ECONNREFUSED, ENOTSOCK, EACCES); other errors throw.
Fd unix_connect(const std::string& path, int* err);
// accept4 on a non-blocking listening unix socket: an invalid Fd when nothing is pending.
Fd unix_accept(int listen_fd, const std::string& context);
// The peer's credentials (SO_PEERCRED) of a connected unix socket.
struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
PeerCred peer_cred(int fd, const std::string& context);

// mkdir(2) of one directory with `mode`. Throws SysError (EEXIST included).
void make_dir(const std::string& path, mode_t mode);

// open(path, O_PATH | O_DIRECTORY | O_CLOEXEC): a handle on a directory that does nothing but
// name it in /proc/<pid>/fd (how `lspawn status PID` finds a job's status directory).
Fd open_directory_handle(const std::string& path);

using Clock = std::chrono::steady_clock;

}  // namespace lspawn::sys
