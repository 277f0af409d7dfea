// The client side of `lspawn daemon` (daemon.hpp, docs/warm-start.md): what
// `lspawn --start-method warm` and `lspawn daemon --status|--stop` send to a running daemon.
#pragma once

#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spawn/forkserver.hpp"
#include "proto/messages.hpp"

namespace lspawn::daemon {

// Sends {op} ("status", "stop") to the daemon on `socket_path` and returns its reply; nullopt
// when no daemon listens there (*why: the connect error). Throws on a broken reply.
std::optional<proto::DaemonReply> ask(const std::string& socket_path, const std::string& op, std::string* why);

// A per-run server of the daemon's warm forkserver of a program, driven by this process.
struct WarmServer {
  std::unique_ptr<Forkserver> server;  // attached (Forkserver::attach): not our child
  proto::DaemonReply reply;            // pids, reused, runs
};

// Asks the daemon on `socket_path` for a server of the warm forkserver of `path` (absolute)
// executed with `argv` and `env` (`preload`: a Python interpreter running lspawn's preload
// server, launcher/python_preload.hpp, instead of a program linking the hook), starting that forkserver when the daemon has none for this
// unchanged program, arguments and environment. nullopt when no daemon listens there (*why says
// why). Throws SpawnError with the daemon's reason when it refused or the program could not be
// a forkserver, ForkserverInterrupted when a signal of `interrupt` (blocked by the caller)
// arrives while waiting, sys::SysError / wire::WireError when the daemon broke off.
std::optional<WarmServer> warm_server(const std::string& socket_path, const std::string& path,
                                      const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                      const sigset_t* interrupt, std::string* why, bool preload = false);

}  // namespace lspawn::daemon
