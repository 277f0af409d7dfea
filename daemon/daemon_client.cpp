#include "daemon/daemon_client.hpp"

#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sys/fd_frame.hpp"
#include "spawn/errors.hpp"
#include "sys/sys.hpp"
#include "proto/wire.hpp"

namespace lspawn::daemon {
namespace {

constexpr uint32_t kMaxReplyBytes = 1u << 20;

sys::Fd connect(const std::string& socket_path, std::string* why) {
  int err = 0;
  sys::Fd fd = sys::unix_connect(socket_path, &err);
  if (!fd && why) *why = std::strerror(err);
  return fd;
}

// Waits until `fd` is readable; a signal of `interrupt` first throws ForkserverInterrupted.
void wait_readable(int fd, const sigset_t* interrupt, const std::string& context) {
  sys::Fd sigfd;
  if (interrupt) {
    sigfd = sys::Fd(::signalfd(-1, interrupt, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!sigfd) sys::throw_errno("signalfd", context);
  }
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {sigfd.get(), POLLIN, 0}};
    const int n = ::poll(p, sigfd ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) sys::throw_errno("poll", context);
    if (sigfd && p[1].revents) {
      signalfd_siginfo si{};
      const ssize_t got = ::read(sigfd.get(), &si, sizeof si);
      throw ForkserverInterrupted(got == static_cast<ssize_t>(sizeof si) ? int(si.ssi_signo) : SIGINT);
    }
    if (p[0].revents) return;
  }
}

proto::DaemonReply call(int fd, const proto::DaemonRequest& req, sys::Fd* fds, size_t max_fds,
                        const sigset_t* interrupt, const std::string& context) {
  sys::write_all(fd, wire::encode_frame(req), context);
  wait_readable(fd, interrupt, context);
  proto::DaemonReply reply;
  if (!fd_frame::read(fd, reply, fds, max_fds, kMaxReplyBytes, context)) {
    throw wire::WireError(context + ": the daemon closed the connection without a reply");
  }
  wire::check_version(reply.version, "DaemonReply");
  return reply;
}

}  // namespace

std::optional<proto::DaemonReply> ask(const std::string& socket_path, const std::string& op, std::string* why) {
  sys::Fd fd = connect(socket_path, why);
  if (!fd) return std::nullopt;
  proto::DaemonRequest req;
  req.version = wire::kSchemaVersion;
  req.op = op;
  return call(fd.get(), req, nullptr, 0, nullptr, "lspawn daemon on " + socket_path);
}

std::optional<WarmServer> warm_server(const std::string& socket_path, const std::string& path,
                                      const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                      const sigset_t* interrupt, std::string* why, bool preload) {
  sys::Fd fd = connect(socket_path, why);
  if (!fd) return std::nullopt;
  proto::DaemonRequest req;
  req.version = wire::kSchemaVersion;
  req.op = "forkserver";
  req.preload = preload;
  req.path = path;
  req.argv = argv;
  req.env = env;
  const std::string context = "lspawn daemon on " + socket_path;
  sys::Fd fds[2];
  WarmServer w;
  w.reply = call(fd.get(), req, fds, 2, interrupt, context);
  if (!w.reply.error.empty())
    throw SpawnError("the daemon (pid " + std::to_string(w.reply.daemon_pid) + ") on " + socket_path + ": " +
                     w.reply.error);
  if (!fds[0] || !fds[1] || w.reply.server_pid <= 0) {
    throw wire::WireError(context + ": the reply carries no server");
  }
  w.server = Forkserver::attach(static_cast<pid_t>(w.reply.server_pid), std::move(fds[0]), std::move(fds[1]));
  return w;
}

}  // namespace lspawn::daemon
