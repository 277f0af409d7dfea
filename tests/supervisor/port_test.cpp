// The reserved MASTER_PORT: not handed out by bind(0) while held, yet bindable by a
// SO_REUSEADDR listener (what c10d's TCPStore does).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "supervisor/port.hpp"

namespace {
int bound_socket(int port, bool reuse, bool do_listen, int* got_port = nullptr, int* err = nullptr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || (do_listen && listen(fd, 4) != 0)) {
    if (err) *err = errno;
    close(fd);
    return -1;
  }
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  if (got_port) *got_port = ntohs(sa.sin_port);
  return fd;
}
}  // namespace

TEST_CASE("port reservation: bind(0) never hands out the reserved port", "[port]") {
  lspawn::PortReservation res("127.0.0.1", 0);
  REQUIRE(res.port() > 0);
  // Hold many ephemeral ports at once (so each bind(0) gets a new one), with and without
  // SO_REUSEADDR, listening or not: none may be ours.
  std::vector<int> fds;
  int clashes = 0;
  for (int i = 0; i < 3000; ++i) {
    int p = 0;
    int fd = bound_socket(0, i % 2 == 0, i % 3 == 0, &p);
    if (fd < 0) break;  // ephemeral range exhausted: enough
    clashes += p == res.port();
    fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  CHECK(fds.size() > 500);  // bounded by RLIMIT_NOFILE (often 1024)
  CHECK(clashes == 0);
}

TEST_CASE("port reservation: a SO_REUSEADDR server can still bind and listen on it", "[port]") {
  lspawn::PortReservation res("127.0.0.1", 0);
  int err = 0;
  int fd = bound_socket(res.port(), true, true, nullptr, &err);
  INFO(strerror(err));
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
}

TEST_CASE("port reservation: a port someone listens on is refused with the address", "[port]") {
  int port = 0;
  int fd = bound_socket(0, false, true, &port);
  REQUIRE(fd >= 0);
  try {
    lspawn::PortReservation res("127.0.0.1", port);
    FAIL("reserved a port in use");
  } catch (const lspawn::PortError& e) {
    CHECK(e.error() == EADDRINUSE);
    CHECK(std::string(e.what()) ==
          "127.0.0.1:" + std::to_string(port) + " is already in use (bind: Address already in use)");
  }
  close(fd);
  // Released: now it can be reserved, explicitly.
  lspawn::PortReservation again("127.0.0.1", port);
  CHECK(again.port() == port);
}

TEST_CASE("port reservation: unresolvable address and bad port", "[port]") {
  CHECK_THROWS_AS(lspawn::PortReservation("no-such-host.invalid", 0), lspawn::PortError);
  CHECK_THROWS_AS(lspawn::PortReservation("127.0.0.1", 70000), lspawn::PortError);
}
