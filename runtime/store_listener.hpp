// Where rank 0's rendezvous store listens: one address, never every interface.
//
// c10d's TCPStore server binds the wildcard address ([::] dual-stack), so by default any host
// that reaches the machine can talk to a job's store. lspawn makes it listen on one address:
//
//   - LSPAWN_BIND_ADDR when set (the CLI's --bind-addr; "0.0.0.0" or "::" give back torch's
//     every-interface behaviour on purpose);
//   - else MASTER_ADDR's own address: 127.0.0.1 for a single-node job (the CLI's default
//     MASTER_ADDR), the master node's interface for a multi-node one.
//
// How, per LibTorch line (runtime/torch_compat.hpp): 2.x takes a listening socket
// (TCPStoreOptions::masterListenFd): listen_socket() makes it. 1.13 has no such option and binds
// its own socket inside the TCPStore constructor, on the calling thread; a BindSteering alive on
// that thread rewrites the wildcard address of the bind() calls made meanwhile to the chosen one
// (lspawn_runtime defines bind(), runtime/socket_calls.hpp, which forwards to the system call;
// with no BindSteering alive on the calling thread it changes nothing). This takes effect when
// lspawn_runtime is linked into the executable (its bind() then comes first in symbol lookup), as
// in every lspawn program; interposed() and applied() say whether it did, and host_store() warns
// when it did not.
#pragma once

#include <chrono>
#include <string>

#include <sys/socket.h>

#include "runtime/worker_env.hpp"

namespace lspawn {

// Half a message on the store's port: every socket the store accepts gets SO_RCVTIMEO = this
// (inherited from the listening socket lspawn makes or steers), so a client that sends half a
// message and waits stalls TCPStore 1.13's single server thread for at most this long, never for
// good; the server then drops that client. The store gate (runtime/store_gate.hpp) waits as long
// for the rest of a first request.
// Legitimate clients send each request at once, but its bytes can still arrive seconds apart: a
// request is several small writes (TCPStore sets TCP_NODELAY), and when one segment is lost TCP
// resends it after its retransmission timeout, 1 s at least on a new connection and doubling at
// each loss (RFC 6298). Until #47 this was 1 s: one lost segment on a link with 200 ms of latency
// and 5 % loss dropped a rank's store connection (`lost the store ...: Connection reset by peer`)
// and failed the job (docs/reliability.md, "Slow and lossy links"). 30 s is the default node
// timeout: the store gives up on a silent client no sooner than the nodes give up on each other.
// Strangers never reach the server (the gate refuses them on their first bytes).
inline constexpr std::chrono::milliseconds kStoreReceiveTimeout{30'000};

// The numeric address the store should listen on (see above: env.bind_addr, else
// env.master_addr). Throws std::runtime_error naming the variable and the address when it
// cannot be resolved.
std::string store_bind_address(const WorkerEnv& env);

// True for 0.0.0.0 / :: (listen on every interface).
bool is_wildcard_address(const std::string& numeric);

// A TCP socket bound to addr:port (SO_REUSEADDR, SO_RCVTIMEO = kStoreReceiveTimeout,
// close-on-exec) and listening. Throws
// std::system_error naming the call and addr:port.
int listen_socket(const std::string& numeric_addr, uint16_t port);

// While alive, bind() calls of this thread to a wildcard address go to `numeric_addr` instead
// (same port; an AF_INET6 socket gets the IPv4-mapped form of an IPv4 address), with
// SO_RCVTIMEO = kStoreReceiveTimeout. One per thread.
class BindSteering {
 public:
  explicit BindSteering(const std::string& numeric_addr);
  ~BindSteering();
  BindSteering(const BindSteering&) = delete;
  BindSteering& operator=(const BindSteering&) = delete;
  // How many bind() calls were steered so far.
  int applied() const;
  // Whether the process's bind() is lspawn_runtime's (runtime/socket_calls.hpp): without it
  // nothing is steered.
  bool interposed() const { return interposed_; }

 private:
  sockaddr_storage v4_{};  // the address as AF_INET (unused when it is IPv6)
  sockaddr_storage v6_{};  // the address as AF_INET6 (IPv4-mapped for an IPv4 address)
  bool is_v4_ = false;
  bool interposed_ = false;
};

}  // namespace lspawn
