// Command line of `lspawn [options] [--] program [args...]` (docs/cli.md).
//
// parse_cli() only parses and validates; it starts nothing and touches no file or socket.
#pragma once

#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "launcher/torchrun_compat.hpp"

namespace lspawn {

// Exit statuses of the lspawn binary (docs/exit-codes.md). A worker's own exit code (or
// 128+N for its signal N) is passed through when that worker is the root cause.
namespace exit_codes {
inline constexpr int kSuccess = 0;
inline constexpr int kUsage = 2;              // bad option, port in use, log dir unusable
inline constexpr int kRendezvous = 122;       // the nodes of a multi-node job did not meet
inline constexpr int kNodeLost = 123;         // a node of the job was lost (its lspawn or link)
inline constexpr int kHang = 124;             // --hang-timeout: no rank made progress (as timeout(1))
inline constexpr int kInternal = 125;         // lspawn itself failed (fork, pipe, ...)
inline constexpr int kCannotExecute = 126;    // program found but not executable
inline constexpr int kNotFound = 127;         // program not found
}  // namespace exit_codes

// How workers are started (--start-method).
enum class CliStartMethod {
  Exec,        // fork + exec of the program per worker (any program)
  Forkserver,  // exec the program once; it forks the workers after its static initialisation
  Warm,        // like Forkserver, from the per-node daemon's forkserver kept between runs
               // (docs/warm-start.md); a cold forkserver when no daemon runs
};

struct CliOptions {
  int nproc_per_node = 1;          // --nprocs / --nproc-per-node, >= 1
  int nnodes = 1;                  // --nnodes, >= 1
  int node_rank = 0;               // --node-rank, 0 <= node_rank < nnodes
  std::string master_addr = "127.0.0.1";  // --master-addr
  int master_port = 0;             // --master-port; 0: a free port is reserved
  std::string run_id;              // --run-id / --rdzv-id; empty: random (drawn by node 0)
  std::string bind_addr;           // --bind-addr: where rank 0's store listens; empty: the
                                   // address of --master-addr (loopback on one node)
  double grace_period_s = 5.0;     // --grace-period, seconds, >= 0
  std::string log_dir;             // --log-dir; empty: console only
  bool tee = false;                // --tee: with --log-dir, also to the console
  bool prefix = true;              // --no-prefix clears it
  bool quiet = false;              // --quiet: no info lines (errors still printed)
  CliStartMethod start_method = CliStartMethod::Exec;  // --start-method exec|forkserver|warm, --warm
  std::string daemon_socket;       // --daemon-socket PATH (warm); empty: daemon::default_socket_path()
  std::vector<std::string> preload;  // --preload M[,M...]: a Python program run from a server that
                                     // imported them once (python_preload.hpp); start_method is
                                     // then Forkserver (or Warm), never Exec
  int max_restarts = 0;            // --max-restarts K: restart every node's workers up to K times
  // Multi-node (parse_multinode_option; docs/multi-node.md).
  bool node_rank_given = false;    // --node-rank was given (else rdzv mode assigns one)
  std::string rdzv_endpoint;       // --rdzv-endpoint HOST[:PORT]; empty: static (master addr/port)
  std::string rdzv_host;           // its parts
  int rdzv_port = 0;
  double node_timeout_s = 30.0;    // --node-timeout: a silent node is lost after this
  double rdzv_timeout_s = 600.0;   // --rdzv-timeout: every node must have joined by then
  double hang_timeout_s = 0;       // --hang-timeout SECONDS; 0: no watchdog (reports on SIGURG still)
  bool help = false;               // --help / -h
  bool version = false;            // --version
  std::vector<std::string> program;  // program and its arguments (non-empty unless help/version)
  // torchrun's flags (torchrun_compat.hpp; docs/cli.md "From torchrun"). run_cli() resolves
  // nproc_spec into nproc_per_node and the program convention into the worker's argv.
  std::string nproc_spec;          // --nproc-per-node gpu|cpu|auto; empty: nproc_per_node is the count
  bool standalone = false;         // --standalone: one node, rendezvous on a free local port,
                                   // cluster detection (Slurm, PyTorchJob) off
  ProgramConvention program_convention;  // -m/--module, --no-python, --run-path
  std::optional<StdSpec> redirects;      // --redirects/-r SPEC
  std::optional<StdSpec> tee_spec;       // --tee/-t SPEC (torchrun's form); the boolean --tee is `tee`
  std::string local_addr;          // --local-addr: what this node advertises as its workers'
                                   // store address should it become node 0 (--rdzv-endpoint jobs)
  std::string role = "default";    // --role: the workers' ROLE_NAME
  std::vector<std::pair<std::string, std::string>> rdzv_conf;  // --rdzv-conf KEY=VALUE,... in order
  std::vector<std::string> notes;  // one info line per flag accepted without effect (or changed)
  // Options given on the command line, by their canonical name ("--nprocs" for both spellings,
  // "--node-rank", ...): what the user said explicitly wins over what is detected (launch_env.hpp).
  std::set<std::string> given;
  bool was_given(const std::string& option) const { return given.count(option) != 0; }
};

// A command line lspawn cannot accept. what() names the option and the accepted form.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses args (argv without argv[0]). Throws UsageError. Checks what the flags alone decide;
// what depends on the environment too (e.g. --nnodes > 1 needs a port) is checked by
// resolve_launch() (launch_env.hpp).
CliOptions parse_cli(const std::vector<std::string>& args);

// The --help text.
std::string usage_text();

}  // namespace lspawn
