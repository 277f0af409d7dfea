// The gate in front of rank 0's rendezvous store: every connection to the store's public port is
// accepted here, its first request is checked, and only then is it relayed to the TCPStore server,
// which listens on loopback only (an ephemeral port nobody else is told).
//
// Why: c10d's TCPStore server takes whatever reaches its port. A connection whose bytes are not a
// store request is dropped without a word (2.x: after its failed validation), or — on LibTorch
// 1.13, which has no validation — read as one: a port scanner's bytes become a key length of
// terabytes, and the server allocates it (pytorch/pytorch#106294). The gate names every refused
// peer on rank 0's stderr and keeps such bytes away from the server:
//
//   store at 127.0.0.1:41234: refused a connection from 10.0.0.7:51234: not a c10d store request
//   (first bytes 47 45 54 20 2f 20 48 54)
//
// What it checks, per store protocol (compat::store_protocol()):
//   - Validated (LibTorch >= 2.1): every client opens with VALIDATE and the magic number; the
//     first 5 bytes must be exactly that.
//   - Legacy (1.13): the first byte must be a query type, and the length that follows (key or key
//     count) at most kMaxFirstLength. A client may also stay silent (1.13's callback connection
//     never writes unless a key is watched); silence is not refused.
// A peer that sends part of the header and then nothing for kStoreReceiveTimeout (30 s: a lossy
// link's retransmissions, runtime/store_listener.hpp) is refused too.
// After the first request the bytes are relayed unchanged both ways, and the connection lives as
// long as both ends keep it.
//
// What it does not do: parse requests after the first (a client that opened correctly talks to
// TCPStore as before), or authenticate (the records are: runtime/authenticated_store.hpp).
//
// Cost: one thread in rank 0, an epoll set of the gate's sockets (work per event, not per
// connection: 4,096 ranks cost the gate as little per request as 64); a relayed request crosses
// loopback once more (tens of µs; a rendezvous makes a few dozen requests per rank;
// docs/scale-store.md). The connect to the server does not block the thread: a server that is
// slow to accept stalls the clients waiting for it, not the others. When accept() fails (EMFILE),
// the gate says so and accepts again 100 ms later; the clients wait in the backlog meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/store_listener.hpp"

namespace lspawn {

enum class StoreProtocol {
  Validated,  // LibTorch >= 2.1: VALIDATE + magic first
  Legacy,     // LibTorch 1.13: a query type, then a length
};

// Largest first key (or key count) a Legacy request may announce: lspawn's and gloo's keys are
// tens of bytes.
inline constexpr std::uint64_t kMaxFirstLength = 1 << 20;

// Whether `head` (the first bytes a client sent) can start a store request.
enum class HeadVerdict { NeedMore, Accept, Refuse };
HeadVerdict check_store_head(StoreProtocol protocol, const std::uint8_t* head, std::size_t n);

class StoreGate {
 public:
  // Serves `listen_fd` (bound and listening; the gate owns and closes it) and relays accepted
  // clients to 127.0.0.1:`store_port`. `where` names the public endpoint in messages; `log`
  // receives each message (one line, no newline); by default it goes to stderr. A client that
  // sent part of its first request's header and then nothing for `head_timeout` is refused.
  StoreGate(int listen_fd, std::uint16_t store_port, StoreProtocol protocol, std::string where,
            std::function<void(const std::string&)> log = {},
            std::chrono::milliseconds head_timeout = kStoreReceiveTimeout);
  // Stops the thread and closes every connection (clients see the store go away).
  ~StoreGate();
  StoreGate(const StoreGate&) = delete;
  StoreGate& operator=(const StoreGate&) = delete;

  // The public port (what clients are told: MASTER_PORT, or the one port 0 picked).
  std::uint16_t port() const { return port_; }
  // Connections refused so far.
  int refused() const;

 private:
  struct Loop;
  std::unique_ptr<Loop> loop_;
  std::uint16_t port_ = 0;
};

}  // namespace lspawn
