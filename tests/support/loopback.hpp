// TCP on 127.0.0.1 for tests: a listener on a port the kernel picks (a port taken, a server
// that never answers, a peer the test accepts itself), and a client for a port lspawn or its
// runtime opened (to send garbage to it, or to see that it accepts connections). Tests only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "sys/sys.hpp"

namespace lspawn::test {

// A TCP socket bound to 127.0.0.1 on a port the kernel picks (port 0), close-on-exec, closed when
// the object goes. No SO_REUSEADDR: nothing else can bind the port while it is open, lspawn
// included ("already in use"). Listening with `backlog` (0: the kernel's shortest queue, for a
// server that never accepts), or, with kNotListening, only bound: connections to it are refused.
// Throws sys::SysError naming the call that failed.
class LoopbackListener {
 public:
  static constexpr int kNotListening = -1;
  explicit LoopbackListener(int backlog = 16, bool nonblocking = false);

  int fd() const { return fd_.get(); }
  uint16_t port() const { return port_; }
  std::string port_text() const { return std::to_string(port_); }
  // Gives the socket to the caller, who closes it.
  int release() { return fd_.release(); }
  // Closes it now: the port is free again (for the next bind of anyone).
  void close() { fd_.reset(); }

 private:
  sys::Fd fd_;
  uint16_t port_ = 0;
};

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
