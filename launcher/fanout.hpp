// `lspawn --hostfile FILE [options] program ...` and `lspawn --hosts A,B,... ...`: one command
// starts the job on every host, through a remote shell (ssh, or --rsh / $LSPAWN_RSH), as mpirun
// does (docs/multi-node.md, "One command for many hosts"). ssh gets options that forbid any
// prompt (hosts.hpp, with_ssh_defaults()).
//
// The caller runs no worker itself: host i runs `lspawn --control-stdin --nnodes N --node-rank i
// --master-addr HOST0 ...` with the caller's other options and program (hosts.hpp), so node 0 is
// the first host. Every host gets the same run id and the same job secret; the secret goes over
// the remote shell's stdin, never on a command line (control_stdin.hpp). The caller:
// - relays every host's output to its own stdout and stderr, line by line, lspawn's own lines
//   prefixed with their host ("[mn-b] lspawn: ...");
// - forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to every host (a line on each channel); a second
//   one, or a host that overstays the grace period by 10 s, ends the remote shells (SIGKILL);
// - when a remote shell fails (exit 255, ssh's own failure: the host is unreachable; or any exit
//   before that host's lspawn said a line: it could not run there) stops the other hosts at once,
//   naming that host; when a host's
//   job fails, the others stop by themselves (one node's failure ends the job on every node),
//   and any still running after --node-timeout plus 10 s are stopped;
// - dies with nothing left behind: each remote shell gets SIGHUP when the caller dies (and, with
//   ssh, the connection's end closes the channel), so every host stops its workers.
// Exit status: 255 when a remote shell failed (as above); else node 0's, else the first other host's that
// is not 0 (each host's lspawn reports the same root cause and exit code); 128+N after signal N.
#pragma once

#include <string>
#include <vector>

#include "launcher/cli_options.hpp"

namespace lspawn::cli {

// Runs the job of `o` (--hostfile or --hosts given) on its hosts; `args` is the command line
// as given (argv without argv[0]). Returns the exit status above; says what went wrong.
int run_on_hosts(const CliOptions& o, const std::vector<std::string>& args);

}  // namespace lspawn::cli
