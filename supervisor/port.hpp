// Reserving the rendezvous port (MASTER_PORT) for the duration of a run, without a race.
//
// How: a TCP socket with SO_REUSEADDR bound to addr:port and NOT listening, held open (and
// O_CLOEXEC, so workers do not inherit it) until the reservation is destroyed. While it is
// held, the kernel does not hand the port to anyone else's bind(addr, 0), yet a server that
// sets SO_REUSEADDR — c10d's TCPStore does — can still bind and listen on it, because our
// socket never listens. A port someone is listening on cannot be reserved (EADDRINUSE).
#pragma once

#include <string>

#include "sys/sys.hpp"
#include "proto/error.hpp"

namespace lspawn {

// A failed reservation; what() reads like
// "127.0.0.1:29500 is already in use (bind: Address already in use)".
class PortError : public lspawn::Error {
 public:
  PortError(const std::string& msg, int err) : lspawn::Error(msg), err_(err) {}
  int error() const { return err_; }  // errno of the failing call

 private:
  int err_;
};

class PortReservation {
 public:
  // Reserves `port` on `addr` (numeric IPv4/IPv6 or a host name resolved with getaddrinfo);
  // port 0 picks a free one. Throws PortError.
  PortReservation(const std::string& addr, int port);
  int port() const { return port_; }
  const std::string& addr() const { return addr_; }
  // Releases the reservation early (e.g. before exec'ing a process that must bind it without
  // SO_REUSEADDR). Idempotent.
  void release() { fd_.reset(); }

 private:
  std::string addr_;
  int port_ = 0;
  sys::Fd fd_;
};

}  // namespace lspawn
