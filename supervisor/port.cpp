#include "supervisor/port.hpp"

#include <cerrno>
#include <cstring>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace lspawn {

PortReservation::PortReservation(const std::string& addr, int port) : addr_(addr) {
  if (port < 0 || port > 65535) {
    throw PortError("port " + std::to_string(port) + " is out of range 0-65535", EINVAL);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res); rc != 0) {
    throw PortError("cannot resolve " + addr + " (getaddrinfo: " + ::gai_strerror(rc) + ")", EINVAL);
  }
  std::string errors;
  int last_err = 0;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    sys::Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last_err = errno;
      errors += std::string(errors.empty() ? "" : "; ") + "socket: " + std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last_err = errno;
      errors += std::string(errors.empty() ? "" : "; ") + "bind: " + std::strerror(errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      last_err = errno;
      errors += std::string(errors.empty() ? "" : "; ") + "getsockname: " + std::strerror(errno);
      continue;
    }
    port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    fd_ = std::move(fd);
    break;
  }
  ::freeaddrinfo(res);
  if (!fd_) {
    const std::string what = last_err == EADDRINUSE ? " is already in use (" : " cannot be reserved (";
    throw PortError(addr + ":" + std::to_string(port) + what + errors + ")", last_err);
  }
}

}  // namespace lspawn
