#include "runtime/store_listener.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "supervisor/env_contract.hpp"
#include "runtime/socket_calls.hpp"

namespace lspawn {
namespace {

// The BindSteering alive on this thread, if any, and how many binds it steered.
struct Steering {
  const sockaddr_storage* v4 = nullptr;
  const sockaddr_storage* v6 = nullptr;
  bool is_v4 = false;
  int applied = 0;
};
thread_local Steering t_steering;

bool wildcard(const sockaddr* addr, socklen_t len) {
  if (addr == nullptr) return false;
  if (addr->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    return reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (addr->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  }
  return false;
}

int raw_bind(int fd, const sockaddr* addr, socklen_t len) {
  return static_cast<int>(::syscall(SYS_bind, fd, addr, len));
}

// Accepted sockets inherit SO_RCVTIMEO from their listener (Linux clones the listener's socket):
// a server that reads a message with blocking recv() calls — TCPStore 1.13's one daemon thread
// does, once poll() says a client is readable — then waits at most this long for the rest of a
// half-sent message instead of forever.
void bound_receive_time(int fd) {
  timeval tv{};
  tv.tv_sec = kStoreReceiveTimeout.count() / 1000;
  tv.tv_usec = static_cast<suseconds_t>((kStoreReceiveTimeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

}  // namespace

bool is_wildcard_address(const std::string& numeric) {
  sockaddr_storage ss{};
  if (::inet_pton(AF_INET, numeric.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    ss.ss_family = AF_INET;
    return wildcard(reinterpret_cast<sockaddr*>(&ss), sizeof(sockaddr_in));
  }
  if (::inet_pton(AF_INET6, numeric.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) == 1) {
    ss.ss_family = AF_INET6;
    return wildcard(reinterpret_cast<sockaddr*>(&ss), sizeof(sockaddr_in6));
  }
  return false;
}

std::string store_bind_address(const WorkerEnv& env) {
  const bool from_var = !env.bind_addr.empty();
  const std::string host = from_var ? env.bind_addr : env.master_addr;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    throw std::runtime_error(std::string("cannot resolve ") + (from_var ? env::kLspawnBindAddr : "MASTER_ADDR") + "='" +
                             host + "' to choose the store's listening address: getaddrinfo: " + ::gai_strerror(rc));
  }
  char buf[INET6_ADDRSTRLEN] = {};
  const void* a = res->ai_family == AF_INET
                      ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr)
                      : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr);
  ::inet_ntop(res->ai_family, a, buf, sizeof buf);
  ::freeaddrinfo(res);
  return buf;
}

int listen_socket(const std::string& numeric_addr, uint16_t port) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (::inet_pton(AF_INET, numeric_addr.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    ss.ss_family = AF_INET;
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
    len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, numeric_addr.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr) == 1) {
    ss.ss_family = AF_INET6;
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
    len = sizeof(sockaddr_in6);
  } else {
    throw std::system_error(EINVAL, std::generic_category(),
                            "listen_socket: '" + numeric_addr + "' is not a numeric address");
  }
  const std::string where = numeric_addr + ":" + std::to_string(port);
  const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket (" + where + ")");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bound_receive_time(fd);
  if (raw_bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::system_error(err, std::generic_category(), "bind/listen (" + where + ")");
  }
  return fd;
}

BindSteering::BindSteering(const std::string& numeric_addr) {
  auto* v4 = reinterpret_cast<sockaddr_in*>(&v4_);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&v6_);
  v6->sin6_family = AF_INET6;
  if (::inet_pton(AF_INET, numeric_addr.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    is_v4_ = true;
    // ::ffff:a.b.c.d for a dual-stack AF_INET6 socket.
    v6->sin6_addr.s6_addr[10] = 0xff;
    v6->sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&v6->sin6_addr.s6_addr[12], &v4->sin_addr, 4);
  } else if (::inet_pton(AF_INET6, numeric_addr.c_str(), &v6->sin6_addr) != 1) {
    throw std::invalid_argument("BindSteering: '" + numeric_addr + "' is not a numeric address");
  }
  if (t_steering.v6 != nullptr) throw std::logic_error("BindSteering: one per thread");
  interposed_ = detail::socket_calls_interposed();
  t_steering = Steering{is_v4_ ? &v4_ : nullptr, &v6_, is_v4_, 0};
}

BindSteering::~BindSteering() { t_steering = Steering{}; }

int BindSteering::applied() const { return t_steering.applied; }

namespace detail {

// bind() with this thread's steering applied (the process's bind(), socket_calls.cpp).
int steered_bind(int fd, const struct sockaddr* addr, socklen_t len) {
  if (t_steering.v6 != nullptr && wildcard(addr, len)) {
    if (addr->sa_family == AF_INET && t_steering.v4 != nullptr) {
      sockaddr_in a;
      std::memcpy(&a, t_steering.v4, sizeof a);
      a.sin_port = reinterpret_cast<const sockaddr_in*>(addr)->sin_port;
      ++t_steering.applied;
      bound_receive_time(fd);
      return raw_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (addr->sa_family == AF_INET6) {
      sockaddr_in6 a;
      std::memcpy(&a, t_steering.v6, sizeof a);
      a.sin6_port = reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port;
      ++t_steering.applied;
      bound_receive_time(fd);
      return raw_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    // An AF_INET socket while steering to an IPv6 address: refuse, TCPStore tries the next.
    errno = EADDRNOTAVAIL;
    return -1;
  }
  return raw_bind(fd, addr, len);
}

}  // namespace detail
}  // namespace lspawn
