// torchrun's command line in lspawn (docs/cli.md, "From torchrun"): the pieces of torchrun 2.15's
// flags that are more than a name — `--nproc-per-node gpu|cpu|auto`, the std-stream specs of
// `--redirects`/`--tee`, `--rdzv-conf`, torchrun's program conventions (`python -u script.py`,
// `-m module`, `--no-python`) and the flags lspawn refuses.
//
// Everything here is a pure function of its arguments except python_interpreter() (which reads
// the environment through a lookup). The GPU and CPU counts are spawn()'s
// local_accelerator_count() (spawn/options.hpp) and placement::usable_cpu_count(), passed in by
// the CLI. parse_cli() (cli_options.hpp) uses the parsers; run_cli() the resolvers.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace lspawn {

// The items of a comma-separated list, empty ones included ("a,,b" -> a, "", b; "" -> one
// empty item), as the CLI's list flags take them: the std specs, --local-ranks-filter, --rdzv-conf,
// --signals-to-handle, --preload.
std::vector<std::string> split_commas(const std::string& v);

// A torchrun std-stream spec (`--redirects`, `--tee`; torchrun's `Std`): bit 1 stdout, bit 2
// stderr, per local rank. "3" applies to every local rank; "0:1,1:2" to the ranks named
// (the others: 0, no stream).
struct StdSpec {
  int all = 0;                  // 0..3, for every local rank when per_rank is empty
  std::map<int, int> per_rank;  // local rank -> 0..3 ("LR:V,..." form); ranks absent: 0
  bool mapped = false;          // the "LR:V,..." form was given
  int mask_for(int local_rank) const;
  bool any() const;  // some stream of some rank is selected
};

// "0".."3" or "LR:V[,LR:V...]" (LR a local rank, V 0..3); nullopt for anything else.
std::optional<StdSpec> parse_std_spec(const std::string& v);

// Where one stream of one local rank goes when a torchrun spec decides it: redirected streams
// go to the log files only, tee'd ones to the files and the console (tee wins over redirect),
// the others to the console only.
struct StdRoute {
  bool console = true;
  bool file = false;
};
StdRoute std_route(const StdSpec& redirects, const StdSpec& tee, int local_rank, bool is_stderr);

// `--local-ranks-filter 0[,1...]` (torchrun's): the local ranks shown on the console; nullopt
// unless the value is one or more non-negative integers separated by commas.
std::optional<std::set<int>> parse_local_ranks(const std::string& v);

// `route` of a local rank once --local-ranks-filter `shown` applies: a rank it does not name
// leaves the console. torchrun then writes that rank's tee'd streams to the files only and sends
// the others, neither redirected nor tee'd, to /dev/null; lspawn keeps those in the files too, so
// every line of every rank is somewhere (the CLI makes a log directory if none is given).
StdRoute filter_route(StdRoute route, const std::set<int>& shown, int local_rank);

// `--nproc-per-node gpu|cpu|auto` with torchrun's meaning: gpu = the NVIDIA GPUs visible to
// this process (`gpus`); cpu = the CPUs it may run on (`cpus`); auto = gpus when > 0, else cpus.
// Returns the count and sets *how to a phrase for the info line ("2 GPUs", "8 CPUs").
// Throws UsageError for gpu when gpus == 0 (naming the flag and CUDA_VISIBLE_DEVICES's value,
// `cuda_visible_devices` null when unset) and for a count above max_procs.
int resolve_nproc_spec(const std::string& spec, int gpus, int cpus, const char* cuda_visible_devices, int max_procs,
                       std::string* how);

// The worker's command line, by torchrun's program conventions (docs/cli.md "Python programs"):
//   --no-python            program as given (exec'd directly); with -m: UsageError
//   -m / --module          python -u -m MODULE args...
//   --run-path             python -u SCRIPT args...
//   program[0] ends in .py python -u SCRIPT args...
//   anything else          program as given (exec'd directly, lspawn's rule before torchrun's flags)
// `python` is the interpreter (python_interpreter()). *reason (may be null) is set to why the
// program runs under Python ("a .py program", "-m", "--run-path"), empty when it does not.
struct ProgramConvention {
  bool module = false;     // -m / --module
  bool no_python = false;  // --no-python
  bool run_path = false;   // --run-path
  bool unbuffered = true;  // python -u, as torchrun; off under --preload, whose one interpreter
                           // serves every worker (PYTHONUNBUFFERED=1 does it for all of them)
};
std::vector<std::string> worker_command(const std::vector<std::string>& program, const ProgramConvention& c,
                                        const std::string& python, std::string* reason);

// The Python that runs Python programs: $LSPAWN_PYTHON, else torchrun's $PYTHON_EXEC, else
// "python3" (searched on PATH when started). *source (may be null): the variable it came from,
// or "default".
std::string python_interpreter(const std::function<std::optional<std::string>(const std::string&)>& env,
                               std::string* source);

// `--rdzv-conf key=value,...` (torchrun's _parse_rendezvous_config): the pairs in order.
// Throws UsageError naming the flag for an entry without '=' or with an empty key.
std::vector<std::pair<std::string, std::string>> parse_rdzv_conf(const std::string& opt, const std::string& v);

// `--log-line-prefix-template T` (torchrun's): T with Python's string.Template safe_substitute
// rules: ${role_name}, ${rank}, ${local_rank} and ${hostname} (also without braces: $rank) are
// replaced, "$$" is "$", any other '$' stays as it is (an unknown ${name} too).
struct PrefixFields {
  std::string role_name;
  int rank = 0;
  int local_rank = 0;
  std::string hostname;  // gethostname(), as torchrun (not the fully qualified name)
};
std::string expand_prefix_template(const std::string& tmpl, const PrefixFields& f);

// `--duplicate-stdout-filters`/`--duplicate-stderr-filters A,B` (torchrun's comma_separated_list):
// the filters (substrings); ",," stands for a comma inside one. "" is no filter (torchrun: "an
// empty filters list won't duplicate any lines"). Throws UsageError naming `opt` for an empty
// filter among others ("a," would match every line).
std::vector<std::string> parse_filter_list(const std::string& opt, const std::string& v);

// torchrun's environment defaults (torch/distributed/argparse_util.py): a flag not on the
// command line takes its value from PET_<FLAG> (upper case, '_' for '-'): PET_MAX_RESTARTS=3 is
// `--max-restarts 3`; a switch (--standalone, --module, --no-python, --run-path) is on when its
// variable is a non-zero integer. Kubeflow's PyTorchJob sets these for an elastic job
// (PET_RDZV_ENDPOINT, PET_MAX_RESTARTS, PET_RDZV_CONF, ...). The node variables (PET_NNODES,
// PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ID) are not
// here: cluster detection reads them as a PyTorchJob's (launchenv/launch_env.hpp). An empty
// variable counts as unset. --shutdown-timeout falls back, as in torchrun, on
// TORCH_ELASTIC_SHUTDOWN_TIMEOUT; neither is read when --grace-period (lspawn's name of the same
// delay) or --shutdown-timeout is on the command line.
struct EnvFlag {
  std::string var;                // "PET_MAX_RESTARTS"
  std::string flag;               // "--max-restarts"
  std::string value;              // "3"
  std::vector<std::string> args;  // what it stands for: {"--max-restarts=3"}; {} for a switch off
};
struct EnvFlags {
  std::vector<EnvFlag> flags;      // in a fixed order, one per variable set
  std::vector<std::string> notes;  // variables of torchrun flags lspawn does not have (ignored)
};
// `given`: the canonical names of the flags on the command line (CliOptions::given), whose
// variables are not read. Throws UsageError naming the variable for a switch that is not an
// integer.
EnvFlags torchrun_env_flags(const std::function<std::optional<std::string>(const std::string&)>& env,
                            const std::set<std::string>& given);

// A torchrun flag lspawn refuses (canonical name, '-' spelling): the message of the UsageError
// ("--numa-binding: torchrun's flag is not supported by lspawn: ...; instead ..."), or nullopt
// when `name` is not one of them.
std::optional<std::string> refused_torchrun_flag(const std::string& name);

}  // namespace lspawn
