#include "support/loopback.hpp"

namespace lspawn::test {

LoopbackListener::LoopbackListener(int backlog, bool nonblocking)
    : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0)) {
  if (!fd_) sys::throw_errno("socket", "test listener on 127.0.0.1");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    sys::throw_errno("bind", "test listener 127.0.0.1:0");
  port_ = static_cast<uint16_t>(sys::local_port(fd_.get()));
  if (backlog != kNotListening && ::listen(fd_.get(), backlog) != 0)
    sys::throw_errno("listen", "test listener 127.0.0.1:" + port_text());
}

}  // namespace lspawn::test
