// A TCP client on 127.0.0.1 for tests that talk to a port lspawn or its runtime opened (to send
// garbage to it, or to see that it accepts connections). Tests only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace lspawn::test {

// A blocking socket connected to 127.0.0.1:port (close-on-exec), or -1 when nothing accepts
// there. The caller closes it.
inline int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace lspawn::test
