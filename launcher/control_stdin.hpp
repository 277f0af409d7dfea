// --control-stdin: how each host's lspawn of `lspawn --hostfile/--hosts` (fanout.hpp) hears from
// the caller that started it through a remote shell. Not for users: the caller adds the flag.
//
// lspawn's stdin is the caller's control channel, one line each:
//   first        the job's secret, which becomes LSPAWN_JOB_SECRET (docs/security.md): never on a
//                command line, where ps(1) shows it to every user of the host;
//   then         SIGINT, SIGTERM, SIGHUP or SIGQUIT: a signal the caller received, raised here;
//   at its end   (the caller, its remote shell or the connection gone) SIGHUP, as a terminal's
//                hangup: the workers are stopped, nothing is left on the host.
// The workers get /dev/null as stdin. A thread with every signal blocked reads the channel and
// raises what it says on this process, where lspawn's own signal handling takes it.
#pragma once

#include <chrono>
#include <optional>

namespace lspawn::cli {

// Takes stdin over as above. Returns an exit code (said) when no secret came within `timeout`
// or it is not one; nullopt once the secret is set and the reader runs.
std::optional<int> take_control_stdin(std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace lspawn::cli
