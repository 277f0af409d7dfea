#include "support/ports.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sys/sys.hpp"

namespace lspawn::test {

ReservedPort::ReservedPort(bool listening) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) sys::throw_errno("socket", "test port");
  int one = 1;
  if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) sys::throw_errno("setsockopt", "test port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) sys::throw_errno("bind", "test port 0.0.0.0:0");
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) sys::throw_errno("getsockname", "test port");
  port_ = ntohs(a.sin_port);
  if (listening && ::listen(fd_, 4) != 0) sys::throw_errno("listen", "test port " + std::to_string(port_));
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace lspawn::test
