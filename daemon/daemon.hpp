// `lspawn daemon`: the per-node warm-start daemon (docs/warm-start.md).
//
// It keeps the forkserver of a program (an exec of it that stopped after its static
// initialisation, forkserver_hook.hpp) alive between runs, so that the next
// `lspawn --start-method warm` of the same unchanged program forks its workers from warm memory
// instead of loading LibTorch again.
//
// Who is who:
//   daemon ── exec ──► warm forkserver (one per key: the program file's identity — path, device,
//   inode, size, mtime, ctime — its argv and the environment it is executed with)
//   warm forkserver ── fork ──► a per-run server (ForkRequest::server), one per client run, whose
//   request socket and exit pipe the daemon hands to the client (SCM_RIGHTS) and closes
//   per-run server ── fork ──► the run's workers, requested by the client lspawn itself
// The client lspawn supervises its workers exactly as with --start-method forkserver (adopted
// by its Supervisor, exits from the server's exit pipe, process groups guarded by its Guardian);
// the daemon never sees them. Every link is PR_SET_PDEATHSIG(SIGKILL) on the one above: the
// daemon dying takes its forkservers, their servers and every worker with it; a client dying
// closes its server's socket (EOF: the server kills its workers and exits) and its Guardian
// kills their process groups.
//
// The socket: a unix stream socket in a directory owned by the user with no access for anyone
// else (created 0700 when missing; an existing one that is a link, someone else's or open to
// group/others is refused); every connection's peer is checked with SO_PEERCRED and one from
// another uid is refused with a message naming its pid and uid. A request must arrive whole
// within 5 s and be a valid DaemonRequest frame of at most 4 MiB; anything else is rejected with
// a message naming the peer, and the daemon goes on.
//
// Single-threaded, one poll loop; starting a new forkserver blocks it until the program is
// ready (other clients wait). Library code never exits: run() returns the exit status.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "proto/error.hpp"

namespace lspawn::daemon {

// $XDG_RUNTIME_DIR/lspawn/daemon.sock when XDG_RUNTIME_DIR is set, else /tmp/lspawn-UID/daemon.sock.
std::string default_socket_path();

// The daemon could not start (its socket directory, another daemon on the socket, ...).
class DaemonError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

struct Options {
  std::string socket_path;                          // empty: default_socket_path()
  size_t max_forkservers = 4;                       // idle ones beyond this are stopped, oldest first
  std::chrono::seconds idle_timeout{3600};          // an unused forkserver is stopped after this; 0: never
  std::chrono::milliseconds ready_timeout{120000};  // a program's static initialisation
  std::chrono::milliseconds request_timeout{5000};  // a connection's request must arrive by then
  std::function<void(const std::string&)> log;      // one line, no "\n"; empty: stderr
};

// Binds the socket and serves until SIGTERM, SIGINT or SIGHUP (blocked in the calling thread
// and read through a signalfd) or a "stop" request. Returns 0, or 1 when the socket cannot be
// set up (the reason logged). Stops every forkserver (and so every worker still running) before
// it returns, and removes the socket.
int run(const Options& o);

// `lspawn daemon ...` (args: what follows "daemon"). Returns the exit status.
int run_command(const std::vector<std::string>& args);

}  // namespace lspawn::daemon
