// lspawn::Error (proto/error.hpp) is the base of every exception the torch-free parts throw: one
// clause catches them all, and what() is kept. The LibTorch-linked parts' classes are checked in
// tests/strategies/units_test.cpp.
#include <catch2/catch.hpp>

#include <type_traits>

#include "cluster/node_channel.hpp"
#include "cluster/rendezvous.hpp"
#include "daemon/daemon.hpp"
#include "launchenv/env_syntax_error.hpp"
#include "placement/topology.hpp"
#include "proto/error.hpp"
#include "proto/wire.hpp"
#include "shm/communicator.hpp"
#include "spawn/codec.hpp"
#include "spawn/errors.hpp"
#include "spawn/forkserver.hpp"
#include "supervisor/port.hpp"
#include "sys/exit_codes.hpp"
#include "sys/sys.hpp"

namespace {

template <class... E>
constexpr bool all_lspawn_errors = (std::is_base_of_v<lspawn::Error, E> && ...);

static_assert(std::is_base_of_v<std::runtime_error, lspawn::Error>);
static_assert(all_lspawn_errors<lspawn::sys::SysError, lspawn::UsageError, lspawn::wire::WireError, lspawn::PortError,
                                lspawn::daemon::DaemonError, lspawn::EnvSyntaxError, lspawn::placement::TopologyError,
                                lspawn::shm::Error, lspawn::CodecError, lspawn::SpawnError, lspawn::ProcessException,
                                lspawn::ForkserverInterrupted, lspawn::node::BadMessage, lspawn::node::LinkError,
                                lspawn::node::NodeRendezvousError>);

}  // namespace

TEST_CASE("lspawn::Error catches what lspawn throws, with its message", "[error]") {
  try {
    lspawn::sys::waitpid(999999, nullptr, 0, "rank 3");
    FAIL("waitpid of no child did not throw");
  } catch (const lspawn::Error& e) {
    CHECK(std::string(e.what()) == "waitpid(999999) (rank 3): No child processes");
    CHECK(dynamic_cast<const lspawn::sys::SysError*>(&e) != nullptr);
  }
  try {
    throw lspawn::UsageError("--nproc-per-node: 'x' is not a number");
  } catch (const lspawn::Error& e) {
    CHECK(std::string(e.what()) == "--nproc-per-node: 'x' is not a number");
  }
}
