// Ports for tests, always picked by the kernel (port 0), never fixed. Tests only.
#pragma once

#include <cstdint>

namespace lspawn::test {

// No "free a moment ago" port: a bind-then-close port can be taken by any other bind(0) before
// the process told it binds it (cluster.pytorchjob failed that way under ctest -j2). A port several
// processes must be told is a ReservedPort, held for the test's life.

// A port bound with SO_REUSEADDR on 0.0.0.0 for the object's life, as lspawn reserves
// MASTER_PORT: not listening (connections are refused until a server such as TCPStore binds and
// listens on it), or listening (connections are accepted by the kernel and never answered).
class ReservedPort {
 public:
  explicit ReservedPort(bool listening = false);  // throws std::runtime_error
  ~ReservedPort();
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

}  // namespace lspawn::test
