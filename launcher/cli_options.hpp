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

#include "launchenv/launch_env.hpp"
#include "launcher/torchrun_compat.hpp"
#include "sys/exit_codes.hpp"

namespace lspawn {

// How workers are started (--start-method).
enum class CliStartMethod {
  Exec,        // fork + exec of the program per worker (any program)
  Forkserver,  // exec the program once; it forks the workers after its static initialisation
  Warm,        // like Forkserver, from the per-node daemon's forkserver kept between runs
               // (docs/warm-start.md); a cold forkserver when no daemon runs
};

// The options; those that place the job (node count and rank, master, run id, what was given
// explicitly) are LaunchFlags, read by cluster detection (resolve_launch, launch_env.hpp).
struct CliOptions : LaunchFlags {
  std::string bind_addr;         // --bind-addr: where rank 0's store listens; empty: the
                                 // address of --master-addr (loopback on one node)
  double grace_period_s = 30.0;  // --grace-period, seconds, >= 0 (torchrun's --shutdown-timeout
                                 // and its default: a job that checkpoints on SIGTERM has time)
  std::string numa_binding;      // --numa-binding node|socket|exclusive|core-complex; empty: none
  int omp_threads = 0;           // --omp-threads N: OMP_NUM_THREADS for every worker, over the
                                 // environment's; 0: env::omp_threads_default()
  std::string log_dir;           // --log-dir; empty: console only
  bool tee = false;              // --tee: with --log-dir, also to the console
  bool prefix = true;            // --no-prefix clears it
  bool quiet = false;            // --quiet: no info lines (errors still printed)
  std::string result_file;       // --result-file PATH: the run's outcome as JSON (proto::RunResult)
  bool no_summary = false;       // --no-summary (needs --result-file): no failure summary printed
  CliStartMethod start_method = CliStartMethod::Exec;  // --start-method exec|forkserver|warm, --warm
  std::string daemon_socket;               // --daemon-socket PATH (warm); empty: daemon::default_socket_path()
  std::vector<std::string> preload;        // --preload M[,M...]: a Python program run from a server that
                                           // imported them once (python_preload.hpp); start_method is
                                           // then Forkserver (or Warm), never Exec
  int max_restarts = 0;                    // --max-restarts K: restart every node's workers up to K times
  std::vector<int> no_restart_exit_codes;  // --no-restart-exit-codes C[,C...]: never retried
  double last_call_s = 30.0;               // --rdzv-conf last_call_timeout: an elastic rendezvous waits
                                           // this long for more nodes once MIN have joined (torchrun's)
  // Multi-node (parse_multinode_option; docs/multi-node.md).
  bool node_rank_given = false;  // --node-rank was given (else rdzv mode assigns one)
  std::string rdzv_host;         // the parts of --rdzv-endpoint (LaunchFlags::rdzv_endpoint)
  int rdzv_port = 0;
  double node_timeout_s = 30.0;     // --node-timeout: a silent node is lost after this
  double rdzv_timeout_s = 600.0;    // --rdzv-timeout: every node must have joined by then
  double hang_timeout_s = 0;        // --hang-timeout SECONDS; 0: no watchdog (reports on SIGURG still)
  bool cpu_backend_lspawn = false;  // --cpu-backend lspawn: Python workers' gloo groups run on lspawn's
                                    // torch.distributed backend for CPU tensors (docs/python-backend.md)
  // One command for many hosts (fanout.hpp, hosts.hpp; docs/multi-node.md).
  std::string hostfile;                  // --hostfile FILE (mpirun's format)
  std::string hosts_list;                // --hosts A[:N],B[:N],...
  std::string rsh;                       // --rsh CMD; empty: $LSPAWN_RSH, else ssh
  std::vector<size_t> host_option_args;  // where those three are in the arguments parsed (their
                                         // words and values): what the hosts' lspawns are not given
  bool control_stdin = false;            // --control-stdin: set by the caller of --hostfile/--hosts on
                                         // each host's lspawn (control_stdin.hpp); not for users
  bool help = false;                     // --help / -h
  bool version = false;                  // --version
  std::vector<std::string> program;      // program and its arguments (non-empty unless help/version)
  // torchrun's flags (torchrun_compat.hpp; docs/cli.md "From torchrun"). run_cli() resolves
  // nproc_spec into nproc_per_node and the program convention into the worker's argv.
  std::string nproc_spec_var = "--nproc-per-node";  // where nproc_spec came from (LaunchSettings::nproc_var)
  ProgramConvention program_convention;             // -m/--module, --no-python, --run-path
  std::optional<StdSpec> redirects;                 // --redirects/-r SPEC
  std::optional<StdSpec> tee_spec;                  // --tee/-t SPEC (torchrun's form); the boolean --tee is `tee`
  std::optional<std::set<int>> local_ranks_filter;  // --local-ranks-filter R[,R...]: the local
                                                    // ranks on the console; the others' output in the log files only
  std::string local_addr;                           // --local-addr: what this node advertises as its workers'
                                                    // store address should it become node 0 (--rdzv-endpoint jobs)
  std::string role = "default";                     // --role: the workers' ROLE_NAME
  std::vector<std::pair<std::string, std::string>> rdzv_conf;  // --rdzv-conf KEY=VALUE,... in order
  std::string log_line_prefix_template;           // --log-line-prefix-template T: the console prefix of each
                                                  // line instead of "[rank N] " (expand_prefix_template())
  std::vector<std::string> duplicate_filters[2];  // --duplicate-stdout-filters [0] and
                                                  // --duplicate-stderr-filters [1]: matching lines are copied to
                                                  // LOG_DIR/filtered_std{out,err}.log
  std::string filtered_dir;                       // where those copies go: --log-dir, else a temporary
                                                  // directory (set by run_cli)
  bool virtual_local_rank = false;                // --virtual-local-rank: LOCAL_RANK=0, one GPU per worker
                                                  // (env::JobEnv::virtual_local_rank)
  std::vector<std::string> notes;                 // one info line per flag accepted without effect (or changed)
};

// Parses args (argv without argv[0]). Throws UsageError. Checks what the flags alone decide;
// what depends on the environment too (e.g. --nnodes > 1 needs a port) is checked by
// resolve_launch() (launch_env.hpp).
CliOptions parse_cli(const std::vector<std::string>& args);

// parse_cli() with torchrun's environment defaults (torchrun_env_flags()): a flag not on the
// command line takes its PET_* variable's value. A bad value throws UsageError naming the
// variable; the variables used are noted (CliOptions::notes) and count as given.
CliOptions parse_cli(const std::vector<std::string>& args, const EnvLookup& env);

// The --help text.
std::string usage_text();

}  // namespace lspawn
