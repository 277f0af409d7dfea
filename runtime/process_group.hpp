// init_process_group(): from a worker's environment to a ready c10d process group.
//
//   lspawn::World world = lspawn::init_process_group();
//   world.pg->allreduce(tensors)->wait();
//
// Steps: read WorkerEnv (unless given) → rendezvous() through the job's TCPStore (rank 0 hosts
// it, see runtime/rendezvous.hpp) → construct the backend's process group on a PrefixStore of
// the run's store → one barrier, so that no rank returns (and possibly exits, taking the store
// server with it when it is rank 0) while another is still connecting.
//
// Errors: EnvError (runtime/worker_env.hpp) for a bad environment, RendezvousError /
// RendezvousTimeout for the rendezvous, ProcessGroupError for the backend; all name the rank
// and world size. Call once per process; the World owns the store and the process group.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/rendezvous_outcome.hpp"
#include "runtime/worker_env.hpp"
#include "proto/error.hpp"

namespace lspawn {

// The backend could not be chosen or constructed (unknown name, NCCL not built in, gloo device
// or connection failure). what() names the backend, rank/world size and the cause.
class ProcessGroupError : public lspawn::Error {
 public:
  explicit ProcessGroupError(const std::string& message) : lspawn::Error(message) {}
};

// Default timeout of one collective (torch's default). Overridden by LSPAWN_PG_TIMEOUT (seconds).
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout{1'800'000};

// Every field: an explicit value wins; a default/empty value falls back to the environment
// variable named, then to the built-in default.
struct InitOptions {
  // "gloo" or "nccl" (only when lspawn was built with NCCL); "shm"/"auto" (the collectives' choice,
  // collectives/group.hpp) give a gloo process group here. "" → env LSPAWN_BACKEND, else "gloo".
  std::string backend;
  // Timeout of each collective. Zero → env LSPAWN_PG_TIMEOUT (seconds), else 30 min.
  std::chrono::milliseconds timeout{0};
  // Rendezvous timeout. Zero → env LSPAWN_RDZV_TIMEOUT (seconds), else 300 s.
  std::chrono::milliseconds rendezvous_timeout{0};
  // The worker's place in the job. Unset → WorkerEnv::from_environment().
  std::optional<WorkerEnv> env;
  // Address or host name gloo binds its sockets to. "" → env LSPAWN_GLOO_HOST; else, when
  // GLOO_SOCKET_IFNAME names an interface, that interface; else 127.0.0.1 on a single node
  // (GROUP_WORLD_SIZE=1), else the local address that routes to MASTER_ADDR.
  std::string interface_host;
  // Threads of the gloo process group (per-process). Zero → 2.
  int gloo_threads = 0;
};

// What a worker gets: everything later layers (collectives, strategies) need.
struct World {
  WorkerEnv env;
  c10::intrusive_ptr<c10d::Store> store;      // the run's store (prefix "lspawn/<run_id>/<restart>")
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // the backend's process group over all ranks
  std::string backend;                        // "gloo" or "nccl" (shm/auto ask for gloo here)
  int cuda_device = -1;                       // nccl: cuda:LOCAL_RANK, made current; else -1
  std::vector<PeerInfo> peers;                // host and pid of every rank, indexed by rank
  std::string gloo_host;                      // gloo: the address its device binds to; "" when
                                              // GLOO_SOCKET_IFNAME chose an interface, or nccl
  std::chrono::milliseconds timeout{0};       // collective timeout in effect
  std::chrono::milliseconds init_time{0};     // time spent in init_process_group()

  int rank() const { return env.rank; }
  int size() const { return env.world_size; }
};

// Joins the job and builds its process group. Blocking; throws on failure (see above).
World init_process_group(const InitOptions& options = {});

// True when this build of lspawn can construct an NCCL process group.
bool have_nccl();

}  // namespace lspawn
