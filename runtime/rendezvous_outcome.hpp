// What a worker learns from the rendezvous, and how the rendezvous fails: PeerInfo (one rank's
// announcement, World::peers), RendezvousError and RendezvousTimeout (thrown by
// init_process_group() and rendezvous()). Part of <lspawn/runtime.hpp>; the rendezvous itself,
// with its store and gate, is runtime/rendezvous.hpp (lspawn's implementation).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "proto/error.hpp"

namespace lspawn {

// The store could not be hosted or reached, or a peer's record is malformed. what() names the
// store's host:port, this rank and world size.
class RendezvousError : public lspawn::Error {
 public:
  explicit RendezvousError(const std::string& message) : lspawn::Error(message) {}
};

// Not every rank arrived within the timeout. what() reads like
// "rendezvous 'abc' timed out after 2.0 s (timeout 2 s) at 127.0.0.1:41234: 3/4 ranks joined,
// missing: [2]".
class RendezvousTimeout : public RendezvousError {
 public:
  RendezvousTimeout(const std::string& message, std::vector<int> missing_ranks)
      : RendezvousError(message), missing_ranks_(std::move(missing_ranks)) {}
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }

 private:
  std::vector<int> missing_ranks_;
};

// One rank's announcement.
struct PeerInfo {
  int rank = -1;
  std::string host;  // gethostname() of the peer
  int64_t pid = 0;
};

}  // namespace lspawn
