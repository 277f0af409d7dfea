#include "launcher/cli.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include <unistd.h>

#include "launchenv/launch_env.hpp"
#include "daemon/daemon.hpp"
#include "hang/status_command.hpp"
#include "launcher/cli_options.hpp"
#include "launcher/control_stdin.hpp"
#include "launcher/fanout.hpp"
#include "launcher/python_preload.hpp"
#include "launcher/run.hpp"
#include "launcher/say.hpp"
#include "launcher/torchrun_compat.hpp"
#include "placement/cpu_list.hpp"
#include "spawn/options.hpp"
#include "supervisor/env_contract.hpp"
#include "sys/sys.hpp"
#include "supervisor/version.hpp"

namespace lspawn {
namespace {

using cli::say;
using cli::workers_text;

// --nproc-per-node gpu|cpu|auto (or a PyTorchJob's PET_NPROC_PER_NODE) becomes a count.
std::optional<int> count_nproc(CliOptions& o) {
  if (o.nproc_spec.empty()) return std::nullopt;
  std::string how;
  // From PET_NPROC_PER_NODE (a PyTorchJob's), the messages name the variable.
  const std::string from = o.nproc_spec_var == "--nproc-per-node" ? "" : o.nproc_spec_var + "=" + o.nproc_spec + ": ";
  try {
    o.nproc_per_node = resolve_nproc_spec(o.nproc_spec, local_accelerator_count(), placement::usable_cpu_count(),
                                          std::getenv("CUDA_VISIBLE_DEVICES"), 4096 /* --nprocs's limit */, &how);
  } catch (const UsageError& e) {
    say(from + e.what());
    return exit_codes::kUsage;
  }
  if (!o.quiet) {
    say((from.empty() ? "--nproc-per-node " + o.nproc_spec + ": " : from) + workers_text(o.nproc_per_node) +
        " per node (" + how + ")");
  }
  return std::nullopt;
}

// A Python program gets its interpreter (worker_command()); *python: it did.
std::optional<int> add_python_interpreter(CliOptions& o, bool* python) {
  std::string source, reason;
  const std::string interpreter = python_interpreter(process_environment(), &source);
  std::vector<std::string> argv;
  try {
    argv = worker_command(o.program, o.program_convention, interpreter, &reason);
  } catch (const UsageError& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  *python = !reason.empty();
  if (reason.empty()) return std::nullopt;
  if (reason != "-m" && ::access(o.program[0].c_str(), R_OK) != 0) {
    const int err = errno;
    say("cannot open the Python program '" + o.program[0] + "': " + std::strerror(err));
    return err == ENOENT ? exit_codes::kNotFound : exit_codes::kCannotExecute;
  }
  if (!o.quiet) {
    std::string line = "running";  // the interpreter and its options up to the script/module
    for (size_t k = 0; k <= argv.size() - o.program.size(); ++k) line += " " + argv[k];
    say(line + " ... (" + reason +
        "; Python: " + (source == "default" ? std::string("python3 on PATH, else set $LSPAWN_PYTHON") : "$" + source) +
        "; --no-python execs the program directly)");
  }
  o.program = argv;
  return std::nullopt;
}

// torchrun's --start-method forkserver for a script: torchrun runs scripts by exec whatever
// its start method (that flag is for function entrypoints); so does lspawn, saying so.
// lspawn's own forkserver needs a program linking its hook, which an interpreter does not;
// --preload is its Python form.
void exec_python_forkserver(CliOptions& o, bool python) {
  if (o.start_method != CliStartMethod::Forkserver || !o.preload.empty() ||
      (!python && !preload::check_program(o.program).empty())) {
    return;
  }
  o.start_method = CliStartMethod::Exec;
  if (!o.quiet) {
    say("--start-method forkserver: a Python program runs by exec, as torchrun runs scripts whatever "
        "its start method; to fork the workers from one interpreter that imported torch once: --preload torch");
  }
}

// Flags that write files when there is no --log-dir get a temporary directory, kept and named
// ("FLAGS without --log-dir: WHAT are in DIR"); empty when it cannot be made (said).
std::string own_log_dir(const std::string& flags, const std::string& what) {
  std::string dir;
  try {
    dir = sys::make_temp_dir("lspawn-logs-");
  } catch (const sys::SysError& e) {
    say(flags + " without --log-dir: cannot create a log directory: " + e.what());
    return dir;
  }
  say(flags + " without --log-dir: " + what + " are in " + dir + " (kept after the run)");
  return dir;
}

// --redirects/--tee, --local-ranks-filter and --duplicate-*-filters without --log-dir get a
// temporary one.
std::optional<int> add_log_dirs(CliOptions& o) {
  // --local-ranks-filter names local ranks of this node; a rank it leaves out writes to files.
  bool hides = false;
  if (o.local_ranks_filter) {
    const int top = *o.local_ranks_filter->rbegin();
    if (top >= o.nproc_per_node) {
      say("--local-ranks-filter: local rank " + std::to_string(top) + " does not exist: each node has " +
          workers_text(o.nproc_per_node) + ", local ranks 0.." + std::to_string(o.nproc_per_node - 1));
      return exit_codes::kUsage;
    }
    hides = static_cast<int>(o.local_ranks_filter->size()) < o.nproc_per_node;
  }
  const bool spec_files = (o.redirects || o.tee_spec) &&
                          ((o.redirects && o.redirects->any()) || (o.tee_spec && o.tee_spec->any()) || o.tee);
  if (o.log_dir.empty() && (spec_files || hides)) {
    o.log_dir = own_log_dir(spec_files ? "--redirects/--tee" : "--local-ranks-filter", "the log files");
    if (o.log_dir.empty()) return exit_codes::kUsage;
  }
  // torchrun's --duplicate-*-filters write their files to the log directory, else to one of
  // their own (the console stays as it is).
  if (!o.duplicate_filters[0].empty() || !o.duplicate_filters[1].empty()) {
    o.filtered_dir =
        o.log_dir.empty() ? own_log_dir("--duplicate-stdout/stderr-filters", "the filtered copies") : o.log_dir;
    if (o.filtered_dir.empty()) return exit_codes::kUsage;
  }
  return std::nullopt;
}

// --virtual-local-rank: every local rank has its device, before any node waits for this one.
std::optional<int> check_virtual_devices(const CliOptions& o) {
  if (!o.virtual_local_rank) return std::nullopt;
  const auto base = env::current_environment();
  std::string map;
  bool hip = false;
  try {
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      const env::VirtualDevice d = env::virtual_visible_device(base, lr);
      map += (lr ? ", " : "") + std::to_string(lr) + " -> " + d.device;
      hip = d.hip;
    }
  } catch (const std::invalid_argument& e) {
    say("--virtual-local-rank: " + std::string(e.what()) + ", for " + std::to_string(o.nproc_per_node) +
        " workers per node");
    return exit_codes::kUsage;
  }
  if (!o.quiet) {
    say(std::string("--virtual-local-rank: each worker has LOCAL_RANK=0 and one visible device (local rank -> ") +
        (hip ? "HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES") + "): " + map);
  }
  return std::nullopt;
}

// torchrun's conventions (torchrun_compat.hpp), once the flags met the environment
// (resolve_launch): --nproc-per-node gpu|cpu|auto (or a PyTorchJob's PET_NPROC_PER_NODE) becomes
// a count, a Python program gets its interpreter, and --redirects/--tee without --log-dir get a
// temporary one. Says what it decided (unless --quiet). Returns an exit status when the run
// cannot start.
std::optional<int> apply_torchrun_conventions(CliOptions& o) {
  if (auto code = count_nproc(o)) return code;
  bool python = false;
  if (auto code = add_python_interpreter(o, &python)) return code;
  exec_python_forkserver(o, python);
  if (auto code = add_log_dirs(o)) return code;
  if (auto code = check_virtual_devices(o)) return code;
  if (!o.preload.empty()) {
    if (auto why = preload::check_program(o.program); !why.empty()) {
      say("--preload: " + why);
      return exit_codes::kUsage;
    }
  }
  return std::nullopt;
}

// Flags + what Slurm / a PyTorchJob say about this node (explicit flags win).
std::optional<int> apply_launch_settings(CliOptions& o) {
  try {
    const LaunchSettings s = resolve_launch(o, process_environment());
    o.nproc_per_node = s.nproc_per_node;
    o.nproc_spec = s.nproc_spec;
    o.nproc_spec_var = s.nproc_var;
    o.nnodes = s.nnodes;
    o.min_nnodes = s.min_nnodes;
    o.node_rank = s.node_rank;
    o.node_rank_given = s.node_rank_given;
    o.master_addr = s.master_addr;
    o.master_port = s.master_port;
    o.run_id = s.run_id;
    if (!s.detected.empty() && !o.quiet) say(s.detected);
  } catch (const UsageError& e) {
    say(e.what());
    return exit_codes::kUsage;
  } catch (const EnvSyntaxError& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

}  // namespace

int run_cli(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "status") {
    return run_status_command(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (!args.empty() && args[0] == "daemon") {
    return daemon::run_command(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  CliOptions o;
  try {
    o = parse_cli(args, process_environment());
  } catch (const UsageError& e) {
    say(e.what());
    say("try 'lspawn --help'");
    return exit_codes::kUsage;
  }
  if (o.help) {
    std::fputs(usage_text().c_str(), stdout);
    std::fflush(stdout);
    return exit_codes::kSuccess;
  }
  if (o.version) {
    std::printf("lspawn %s\n", kVersion);
    std::fflush(stdout);
    return exit_codes::kSuccess;
  }
  if (!o.quiet) {
    for (const auto& note : o.notes) say(note);
  }
  if (!o.hostfile.empty() || !o.hosts_list.empty()) {
    try {
      return cli::run_on_hosts(o, args);
    } catch (const std::exception& e) {
      say(std::string("internal error: ") + e.what());
      return exit_codes::kInternal;
    }
  }
  if (o.control_stdin) {
    if (auto code = cli::take_control_stdin()) return *code;
  }
  if (auto code = apply_launch_settings(o)) return *code;
  // Then torchrun's conventions: a gpu|cpu|auto count, the Python program, the log files.
  if (auto code = apply_torchrun_conventions(o)) return *code;
  try {
    return cli::run_job(o);
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
    return exit_codes::kInternal;
  }
}

}  // namespace lspawn
