// The hosts of `lspawn --hostfile FILE` and `lspawn --hosts A,B,...` (docs/multi-node.md, "One
// command for many hosts"), and what each host's lspawn is told: pure functions, no process and
// no file here (launcher/fanout.hpp starts the hosts).
//
// mpirun's hostfile: one host per line, `NAME [slots=N] [max_slots=M]`, '#' starts a comment,
// blank lines are skipped. NAME is a host name or an address (IPv6 as written, no brackets). A
// host listed twice is an error (mpirun adds the slots; lspawn runs one node per host).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launchenv/launch_env.hpp"

namespace lspawn::hosts {

struct Host {
  std::string name;  // as written
  int slots = 0;     // slots=N (mpirun's); 0 when not given
  int line = 0;      // its line in the hostfile; 0 from --hosts
};

// A hostfile's hosts, in order. Throws UsageError naming `path`:LINE and what is wrong (an
// unknown keyword, a bad count, a host listed twice), or that it lists no host.
std::vector<Host> parse_hostfile(const std::string& text, const std::string& path);

// --hosts NAME[:SLOTS],...; an IPv6 address is [ADDR] or [ADDR]:SLOTS. Throws UsageError.
std::vector<Host> parse_hosts_list(const std::string& list);

// The workers per node: `nprocs` when --nprocs was given (slots are then not read); else the
// hosts' slots when every host has the same; else 1 when none has any. Throws UsageError when
// they differ or only some have slots: every node of an lspawn job runs as many workers.
int workers_per_node(const std::vector<Host>& hosts, std::optional<int> nprocs);

// The remote shell: --rsh's value, else $LSPAWN_RSH, else "ssh", split at blanks as Open MPI's
// plm_rsh_agent ("ssh -p 2222"). Throws UsageError when it names nothing.
std::vector<std::string> rsh_command(const std::string& rsh_flag, const EnvLookup& env);

// ssh's options lspawn adds when the remote shell is ssh (its first word's base name is `ssh`), so
// that no prompt can hang a job whose remote shells run in the background, many at once, with
// their stdin taken by the control channel (docs/multi-node.md, "The remote shell"):
//   -o BatchMode=yes      never ask: no password, passphrase or "trust this host key?" question;
//                         ssh fails at once (exit 255) with its reason ("Permission denied
//                         (publickey,password).", "Host key verification failed.") and lspawn
//                         names the host. Without it a prompt reads the terminal from a
//                         background process group: SIGTTIN stops ssh and the job waits forever.
//   -o ConnectTimeout=10  a host that does not answer fails in 10 s (pdsh's default connect
//                         timeout), not after the kernel's TCP retries (about 2 minutes).
//   -T                    no pseudo-terminal, whatever a RequestTTY of the user's ssh_config says:
//                         a terminal would echo the control channel (the job secret) back.
//   -x                    no X11 forwarding (mpirun and pdsh pass it too).
// StrictHostKeyChecking is left to the user's ssh configuration: lspawn neither trusts a new
// host key nor writes known_hosts for them (an unknown key fails fast under BatchMode; accepting
// it is `--rsh 'ssh -o StrictHostKeyChecking=accept-new'`). A user's own choice wins: an
// option the user's words give with -o (any case, -oKEY=V or -o KEY=V) is not added, nor -T
// after -t/-T, nor -x after -X/-Y/-x. Another program than ssh gets nothing added.
// Returns `rsh` with these inserted after its words (ssh reads the host and command after them).
std::vector<std::string> with_ssh_defaults(std::vector<std::string> rsh);

// A hint that completes the message about a remote shell that failed with `last_line` (its last
// line on stderr), when that is one of the failures BatchMode=yes or ConnectTimeout turn into an
// error (`rsh` is the remote shell with_ssh_defaults() gave); empty otherwise.
std::string ssh_failure_hint(const std::vector<std::string>& rsh, const std::string& last_line);

// `s` quoted for a POSIX shell: '...', a ' inside as '\''. A remote shell joins its arguments
// into one command line that the remote login shell parses again.
std::string shell_quote(const std::string& s);

// What every host's lspawn is told (remote_command()).
struct RemoteJob {
  std::string lspawn;                  // its path there (the caller's own: the same install)
  std::string cwd;                     // the caller's working directory; $HOME where it is missing
  std::vector<Host> hosts;             // node i is hosts[i]; node 0's name is the master address
  int master_port = 29500;             // node 0's rendezvous port (torchrun's default)
  std::string run_id;                  // the job's run id (the same on every node)
  std::optional<int> nprocs;           // --nprocs to add; nullopt when `forwarded` has it
  bool add_master_port = true;         // false when `forwarded` has --master-port
  bool add_run_id = true;              // false when `forwarded` has --run-id / --rdzv-id
  std::vector<std::string> forwarded;  // the caller's arguments but --hostfile, --hosts, --rsh
};

// The command line host `node_rank` runs through the remote shell: a shell command that changes
// to the caller's directory (else $HOME) and execs that host's lspawn with --control-stdin (the
// secret and the signals come on its stdin, never on a command line: control_stdin.hpp), the
// node count, its node rank, the master address and port, the run id and the forwarded
// arguments.
std::string remote_command(const RemoteJob& job, int node_rank);

// The words of remote_command()'s lspawn (unquoted), for tests and messages.
std::vector<std::string> remote_lspawn_args(const RemoteJob& job, int node_rank);

}  // namespace lspawn::hosts
