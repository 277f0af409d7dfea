// Rendezvous: how the workers of one job find each other, through LibTorch's c10d TCPStore.
//
// Who hosts the store: rank 0 of the job, on MASTER_ADDR:MASTER_PORT (lspawn reserves that port
// with a bound, non-listening SO_REUSEADDR socket; rank 0's listening socket also sets
// SO_REUSEADDR, so it can bind and listen on it). That port is the store's gate, which checks each
// connection's first bytes and relays it to the TCPStore server on loopback (HostedStore below). Under torchrun's static rendezvous
// (TORCHELASTIC_USE_AGENT_STORE=True) the launcher hosts it and every rank is a client.
//
// Security (docs/security.md): rank 0's store listens on MASTER_ADDR's address only (or
// LSPAWN_BIND_ADDR), never on every interface; with a job secret (LSPAWN_JOB_SECRET, given by
// lspawn) every record below is written through an AuthenticatedStore, so a client of the store
// without the secret can neither join nor redirect the job (its records are refused and named).
//
// Protocol (keys under the run's prefix): each rank sets rdzv/rank/<r> = "<host>\n<pid>"; rank 0
// waits for all of them and sets rdzv/outcome = "ok" followed by every rank's record (or
// "timeout <joined> <missing...>"), so that the other ranks learn every peer in one read; each
// other rank then sets rdzv/read/<r>, and rank 0 returns once all have.
//
// What rendezvous() guarantees on return: every rank of the job has announced itself (host, pid)
// under the run's prefix "lspawn/<run_id>/<restart_count>/", and the returned store is that
// prefixed view. It does not guarantee that the other ranks are still alive.
//
// Failure: a rank that never arrives makes every other rank throw RendezvousTimeout once
// `timeout` has elapsed since rendezvous() was called, naming the missing ranks. A client that
// cannot reach the store, or a rank 0 that cannot bind, throws RendezvousError naming host:port.
//
// Lifetime: the store server lives inside rank 0's TCPStore object; rank 0 must keep the returned
// store alive while other ranks still use it (init_process_group ends with a barrier for that).
#pragma once

#include <chrono>
#include <memory>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "runtime/authenticated_store.hpp"
#include "runtime/rendezvous_outcome.hpp"
#include "runtime/store_gate.hpp"
#include "runtime/worker_env.hpp"

namespace lspawn {

// Default rendezvous timeout (torchrun's). Overridden by LSPAWN_RDZV_TIMEOUT (seconds).
inline constexpr std::chrono::milliseconds kDefaultRendezvousTimeout{300'000};

struct RendezvousOptions {
  // How long to wait for the store and for every rank to arrive. Unset (zero) → env
  // LSPAWN_RDZV_TIMEOUT (seconds), else kDefaultRendezvousTimeout.
  std::chrono::milliseconds timeout{0};
  // Timeout of later store operations (get/wait) made through the returned store. Zero → same
  // as the rendezvous timeout.
  std::chrono::milliseconds store_timeout{0};
};

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;         // prefixed view "lspawn/<run_id>/<restart>/"
  c10::intrusive_ptr<c10d::TCPStore> tcp_store;  // the underlying store (server on rank 0)
  // The authenticated view under `store` when the worker has a job secret (env.job_secret),
  // else null. Watches for strangers' records until told otherwise (watch_strangers(false)).
  c10::intrusive_ptr<AuthenticatedStore> auth;
  std::string host;                      // store host as given (MASTER_ADDR)
  uint16_t port = 0;                     // store port; the real one when MASTER_PORT=0
  std::vector<PeerInfo> peers;           // indexed by rank, all world_size of them
  std::chrono::milliseconds elapsed{0};  // time spent in rendezvous()
};

// Joins the job described by `env`. Blocking; throws RendezvousError / RendezvousTimeout.
Rendezvous rendezvous(const WorkerEnv& env, const RendezvousOptions& options = {});

// Rank 0's store: a TCPStore server on 127.0.0.1 (a port of its own; the object is also rank 0's
// client of it) behind a StoreGate (runtime/store_gate.hpp) that listens on the public port,
// refuses connections whose first bytes are no store request (naming the peer on stderr) and
// relays the others. getPort() is the server's loopback port; clients are told public_port().
// The gate goes first when the object is destroyed.
class HostedStore : public c10d::TCPStore {
 public:
  HostedStore(const std::string& host, c10d::TCPStoreOptions options, int public_fd, const std::string& where);
  ~HostedStore() override;
  uint16_t public_port() const;
  int refused() const;  // connections the gate refused so far

 private:
  std::unique_ptr<StoreGate> gate_;
};

// Lower level, used by rendezvous(): hosts the store for host:port (port 0 → a free port, see
// public_port()) without waiting for workers, listening on `bind_addr` only (a numeric address;
// "" → every interface, as torch does; runtime/store_listener.hpp). Throws RendezvousError naming
// host:port when the port cannot be bound.
c10::intrusive_ptr<HostedStore> host_store(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                                           const std::string& bind_addr = "");

// Lower level: connects a TCPStore client to host:port, retrying (with a short backoff, unlike
// TCPStore's 1 s) while the server is not yet listening, until `timeout`. Throws RendezvousError
// naming host:port and the elapsed time.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, uint16_t port,
                                                 std::chrono::milliseconds timeout);

// Lower level: the value of `key` if it is set, else nullopt, without waiting: check() then
// get() (one round trip for a missing key, two for a set one). Never a compareSet() probe: the
// TCPStore server of LibTorch >= 2.4 (libuv) wakes every client waiting for a key when a
// compareSet() finds that key missing, and the woken client's get() reads an empty value — gloo
// then crashed parsing a peer's address (docs/architecture.md, "Store wake-ups").
std::optional<std::vector<uint8_t>> try_get(c10d::Store& store, const std::string& key);

// Lower level: store.get(key) — which waits for the key — made robust against a wake-up without
// the key (the libuv server above, or any client's compareSet() on it): an empty value of a key
// that does not exist is not returned; it waits again, until the store's timeout in all.
// Throws std::runtime_error naming the key (and what the store said: its timeout, a lost server).
std::vector<uint8_t> get_when_set(c10d::Store& store, const std::string& key);

// The rendezvous timeout after applying env overrides (see RendezvousOptions::timeout).
std::chrono::milliseconds resolve_rendezvous_timeout(std::chrono::milliseconds requested);

}  // namespace lspawn
