#include "spawn/forkserver_handshake.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "spawn/forkserver.hpp"
#include "proto/wire.hpp"

namespace lspawn::forkserver_handshake {

std::optional<Fds> take_fds() {
  const char* v = std::getenv(kForkserverFdsEnv);
  if (!v) return std::nullopt;
  const std::string value = v;
  ::unsetenv(kForkserverFdsEnv);
  Fds fds;
  char tail = 0;
  if (std::sscanf(value.c_str(), "%d,%d%c", &fds.requests, &fds.exits, &tail) != 2 || fds.requests < 0 ||
      fds.exits < 0 || ::fcntl(fds.requests, F_GETFD) < 0 || ::fcntl(fds.exits, F_GETFD) < 0) {
    throw std::runtime_error(std::string(kForkserverFdsEnv) + "='" + value +
                             "': expected two open fds REQUEST_SOCKET,EXIT_PIPE (set only by lspawn)");
  }
  ::fcntl(fds.requests, F_SETFD, FD_CLOEXEC);
  ::fcntl(fds.exits, F_SETFD, FD_CLOEXEC);
  return fds;
}

void answer(const Fds& fds, const std::string& refusal) {
  proto::ForkReply ready;
  ready.version = wire::kSchemaVersion;
  ready.index = -1;
  ready.pid = ::getpid();
  ready.error = refusal;
  wire::write_frame(fds.requests, ready, "forkserver ready");
}

}  // namespace lspawn::forkserver_handshake
