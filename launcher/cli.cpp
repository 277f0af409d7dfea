#include "launcher/cli.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include <poll.h>
#include <signal.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>

#include "launcher/cli_options.hpp"
#include "daemon/daemon.hpp"
#include "daemon/daemon_client.hpp"
#include "spawn/elf.hpp"
#include "supervisor/env_contract.hpp"
#include "hang/hang_watch.hpp"
#include "supervisor/job_secret.hpp"
#include "cluster/launch_env.hpp"
#include "supervisor/output.hpp"
#include "cluster/node_group.hpp"
#include "supervisor/port.hpp"
#include "launcher/python_preload.hpp"
#include "spawn/errors.hpp"
#include "spawn/forked_workers.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/forkserver_hook.hpp"
#include "spawn/options.hpp"
#include "hang/status_command.hpp"
#include "supervisor/supervisor.hpp"
#include "supervisor/sys.hpp"
#include "launcher/torchrun_compat.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "supervisor/version.hpp"
#include "status/layout.hpp"
#include "status/stack_dump.hpp"

namespace lspawn {
namespace {

void say(const std::string& line) {
  std::string s = "lspawn: " + line + "\n";
  try {
    sys::write_all(2, s, "stderr");
  } catch (const sys::SysError&) {
  }
}


// Removes the private run directory on every way out of run_cli.
struct RunDir {
  std::string path;
  ~RunDir() {
    if (!path.empty()) sys::remove_tree(path);
  }
};

// Sets NAME=value in an environment list, replacing an inherited NAME.
void set_env(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  env.erase(std::remove_if(env.begin(), env.end(), [&](const std::string& kv) { return kv.compare(0, prefix.size(), prefix) == 0; }),
            env.end());
  env.push_back(prefix + value);
}

// How long an exec'd forkserver may take to load and initialise the program.
constexpr std::chrono::seconds kForkserverReadyTimeout{120};

// The variables every worker of this node shares, in the order of the first: the forkserver's
// environment (what static initialisers see before a worker gets its own).
std::vector<std::string> common_environment(const std::vector<std::vector<std::string>>& envs) {
  std::vector<std::string> out;
  for (const auto& kv : envs.front()) {
    bool everywhere = true;
    for (size_t i = 1; i < envs.size() && everywhere; ++i) {
      everywhere = std::find(envs[i].begin(), envs[i].end(), kv) != envs[i].end();
    }
    if (everywhere) out.push_back(kv);
  }
  return out;
}

// --start-method warm: a server of the daemon's warm forkserver of the program (executed with
// the workers' common environment minus every per-run variable: it outlives this run), with
// this run's working directory and umask for the workers. Null when no daemon runs (said once:
// the caller starts a cold forkserver). Throws what daemon::warm_server throws.
std::unique_ptr<Forkserver> warm_forkserver(const CliOptions& o, const std::string& path,
                                            const std::vector<std::string>& argv,
                                            const std::vector<std::vector<std::string>>& envs,
                                            const sigset_t* stop) {
  const std::string socket = o.daemon_socket.empty() ? daemon::default_socket_path() : o.daemon_socket;
  std::vector<std::string> env = env::without_run_variables(common_environment(envs));
  // Also what a shell keeps per directory or invocation: a run from another directory (or
  // another shell) still finds the warm forkserver; each worker gets the run's own values.
  env.erase(std::remove_if(env.begin(), env.end(),
                           [](const std::string& kv) {
                             const std::string name = kv.substr(0, kv.find('='));
                             return name == status::kDirEnv || name == "PWD" || name == "OLDPWD" ||
                                    name == "SHLVL" || name == "_" || name == preload::kArgvEnv;
                           }),
            env.end());
  // The file's absolute path. An interpreter keeps its symbolic link: a venv's bin/python is one
  // (to the base interpreter), and Python finds the venv from the path it was executed by.
  std::string absolute;
  if (o.preload.empty()) {
    char resolved[PATH_MAX];
    if (!::realpath(path.c_str(), resolved)) sys::throw_errno("realpath", path);
    absolute = resolved;
  } else {
    absolute = path;
    if (absolute[0] != '/') {
      char cwd[PATH_MAX];
      if (!::getcwd(cwd, sizeof cwd)) sys::throw_errno("getcwd", path);
      absolute = std::string(cwd) + "/" + path;
    }
  }
  std::string why;
  auto w = daemon::warm_server(socket, absolute, argv, env, stop, &why, !o.preload.empty());
  if (!w) {
    say("--start-method warm: no daemon on " + socket + " (" + why +
        "); starting a cold forkserver (start one with 'lspawn daemon')");
    return nullptr;
  }
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof cwd)) sys::throw_errno("getcwd", "the workers' working directory");
  const mode_t mask = ::umask(0);
  ::umask(mask);
  w->server->set_worker_context(cwd, static_cast<int>(mask));
  if (!o.quiet) {
    say(std::string(w->reply.reused ? "warm" : "new") + " forkserver (pid " + std::to_string(w->reply.forkserver_pid) +
        ", run " + std::to_string(w->reply.runs) + ") of the daemon (pid " + std::to_string(w->reply.daemon_pid) +
        ") on " + socket + "; this run's server: pid " + std::to_string(w->reply.server_pid));
  }
  return std::move(w->server);
}

void make_dirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) sys::throw_errno("mkdir", cur);
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) sys::throw_errno("stat", dir);
  if (!S_ISDIR(st.st_mode)) throw sys::SysError("mkdir", ENOTDIR, dir);
}

// torchrun's --redirects/--tee: passes on to `inner` only the (rank, stream)s `pass` selects.
class RoutedSink : public OutputSink {
 public:
  RoutedSink(OutputSink& inner, std::function<bool(int rank, Stream)> pass) : inner_(inner), pass_(std::move(pass)) {}
  void bytes(int rank, Stream stream, std::string_view data) override {
    if (pass_(rank, stream)) inner_.bytes(rank, stream, data);
  }
  void line(int rank, Stream stream, std::string_view line) override {
    if (pass_(rank, stream)) inner_.line(rank, stream, line);
  }
  void closed(int rank, Stream stream) override {
    if (pass_(rank, stream)) inner_.closed(rank, stream);
  }
  void begin_lines() override { inner_.begin_lines(); }
  void end_lines() override { inner_.end_lines(); }

 private:
  OutputSink& inner_;
  std::function<bool(int, Stream)> pass_;
};

// torchrun's conventions (torchrun_compat.hpp), once the flags met the environment
// (resolve_launch): --nproc-per-node gpu|cpu|auto (or a PyTorchJob's PET_NPROC_PER_NODE) becomes
// a count, a Python program gets its interpreter, and --redirects/--tee without --log-dir get a
// temporary one. Says what it decided (unless --quiet). Returns an exit status when the run
// cannot start.
std::optional<int> apply_torchrun_conventions(CliOptions& o) {
  if (!o.nproc_spec.empty()) {
    std::string how;
    // From PET_NPROC_PER_NODE (a PyTorchJob's), the messages name the variable.
    const std::string from = o.nproc_spec_var == "--nproc-per-node" ? "" : o.nproc_spec_var + "=" + o.nproc_spec + ": ";
    try {
      o.nproc_per_node = resolve_nproc_spec(o.nproc_spec, local_accelerator_count(), usable_cpu_count(),
                                            std::getenv("CUDA_VISIBLE_DEVICES"), 4096 /* --nprocs's limit */, &how);
    } catch (const UsageError& e) {
      say(from + e.what());
      return exit_codes::kUsage;
    }
    if (!o.quiet) {
      say((from.empty() ? "--nproc-per-node " + o.nproc_spec + ": " : from) + std::to_string(o.nproc_per_node) +
          " worker" + (o.nproc_per_node == 1 ? "" : "s") + " per node (" + how + ")");
    }
  }
  std::string source, reason;
  const std::string python = python_interpreter(process_environment(), &source);
  std::vector<std::string> argv;
  try {
    argv = worker_command(o.program, o.program_convention, python, &reason);
  } catch (const UsageError& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  if (!reason.empty()) {
    if (reason != "-m" && ::access(o.program[0].c_str(), R_OK) != 0) {
      const int err = errno;
      say("cannot open the Python program '" + o.program[0] + "': " + std::strerror(err));
      return err == ENOENT ? exit_codes::kNotFound : exit_codes::kCannotExecute;
    }
    if (!o.quiet) {
      std::string line = "running";  // the interpreter and its options up to the script/module
      for (size_t k = 0; k <= argv.size() - o.program.size(); ++k) line += " " + argv[k];
      say(line + " ... (" + reason + "; Python: " +
          (source == "default" ? std::string("python3 on PATH, else set $LSPAWN_PYTHON") : "$" + source) +
          "; --no-python execs the program directly)");
    }
    o.program = argv;
  }
  // torchrun's --start-method forkserver for a script: torchrun runs scripts by exec whatever
  // its start method (that flag is for function entrypoints); so does lspawn, saying so.
  // lspawn's own forkserver needs a program linking its hook, which an interpreter does not;
  // --preload is its Python form.
  if (o.start_method == CliStartMethod::Forkserver && o.preload.empty() &&
      (!reason.empty() || preload::check_program(o.program).empty())) {
    o.start_method = CliStartMethod::Exec;
    if (!o.quiet) {
      say("--start-method forkserver: a Python program runs by exec, as torchrun runs scripts whatever "
          "its start method; to fork the workers from one interpreter that imported torch once: --preload torch");
    }
  }
  // --local-ranks-filter names local ranks of this node; a rank it leaves out writes to files.
  bool hides = false;
  if (o.local_ranks_filter) {
    const int top = *o.local_ranks_filter->rbegin();
    if (top >= o.nproc_per_node) {
      say("--local-ranks-filter: local rank " + std::to_string(top) + " does not exist: each node has " +
          std::to_string(o.nproc_per_node) + " worker" + (o.nproc_per_node == 1 ? "" : "s") + ", local ranks 0.." +
          std::to_string(o.nproc_per_node - 1));
      return exit_codes::kUsage;
    }
    hides = static_cast<int>(o.local_ranks_filter->size()) < o.nproc_per_node;
  }
  // Flags that write files when there is no --log-dir get a temporary directory, kept and named
  // ("FLAGS without --log-dir: WHAT are in DIR"); empty when it cannot be made (said).
  auto own_log_dir = [](const std::string& flags, const std::string& what) {
    std::string dir;
    try {
      dir = sys::make_temp_dir("lspawn-logs-");
    } catch (const sys::SysError& e) {
      say(flags + " without --log-dir: cannot create a log directory: " + e.what());
      return dir;
    }
    say(flags + " without --log-dir: " + what + " are in " + dir + " (kept after the run)");
    return dir;
  };
  const bool spec_files = (o.redirects || o.tee_spec) &&
                          ((o.redirects && o.redirects->any()) || (o.tee_spec && o.tee_spec->any()) || o.tee);
  if (o.log_dir.empty() && (spec_files || hides)) {
    o.log_dir = own_log_dir(spec_files ? "--redirects/--tee" : "--local-ranks-filter", "the log files");
    if (o.log_dir.empty()) return exit_codes::kUsage;
  }
  // torchrun's --duplicate-*-filters write their files to the log directory, else to one of
  // their own (the console stays as it is).
  if (!o.duplicate_filters[0].empty() || !o.duplicate_filters[1].empty()) {
    o.filtered_dir = o.log_dir.empty() ? own_log_dir("--duplicate-stdout/stderr-filters", "the filtered copies")
                                       : o.log_dir;
    if (o.filtered_dir.empty()) return exit_codes::kUsage;
  }
  // --virtual-local-rank: every local rank has its device, before any node waits for this one.
  if (o.virtual_local_rank) {
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
  }
  if (!o.preload.empty()) {
    if (auto why = preload::check_program(o.program); !why.empty()) {
      say("--preload: " + why);
      return exit_codes::kUsage;
    }
  }
  return std::nullopt;
}

// --result-file: the run's outcome for the program that started lspawn (lspawn.spawn() in
// Python, docs/python.md). A file that cannot be written is said, and the exit code kept.
void write_result_file(const std::string& path, const Supervisor& sup, int code, bool hang) {
  proto::RunResult r;
  r.version = wire::kSchemaVersion;
  r.exit_code = code;
  r.hang = hang;
  const auto& results = sup.results();
  for (size_t i = 0; i < results.size(); ++i) {
    const WorkerResult& w = results[i];
    if (sup.root_cause() && w.rank == *sup.root_cause()) r.root_cause = static_cast<int32_t>(i);
    r.ranks.push_back(w.rank);
    r.pids.push_back(w.pid);
    r.exit_codes.push_back(w.exit_code);
    r.signals.push_back(w.term_signal);
    r.stopped.push_back(w.killed_by_supervisor() ? 1 : 0);
  }
  try {
    wire::write_json_file(path, r);
  } catch (const std::exception& e) {
    say(std::string("--result-file: ") + e.what());
  }
}

int run(const CliOptions& o) {
  // 1. The program: found and executable, before anything is started.
  int err = 0;
  const auto path = sys::find_executable(o.program[0], &err);
  if (!path) {
    say("cannot execute '" + o.program[0] + "': " + std::strerror(err));
    return err == ENOENT ? exit_codes::kNotFound : exit_codes::kCannotExecute;
  }
  const bool use_forkserver = o.start_method == CliStartMethod::Forkserver || o.start_method == CliStartMethod::Warm;
  const bool preloading = !o.preload.empty();
  const char* method_flag = preloading ? "--preload"
                            : o.start_method == CliStartMethod::Warm ? "--start-method warm"
                                                                    : "--start-method forkserver";
  // The program executed once as the forkserver: the program itself, or for --preload the Python
  // preload server (python_preload.hpp), which gets the script per worker.
  std::vector<std::string> server_argv = o.program;
  std::string preload_modules;
  if (preloading) {
    try {
      server_argv = preload::server_argv(o.program, o.preload, preload::locate());
    } catch (const std::exception& e) {
      say(std::string(method_flag) + ": " + e.what());
      return exit_codes::kInternal;
    }
    preload_modules = server_argv.back();
  }
  if (use_forkserver && !preloading) {
    bool hooked = false;
    try {
      hooked = elf::has_section(*path, kForkserverNoteSection);
    } catch (const sys::SysError& e) {
      say(std::string(method_flag) + ": cannot read '" + *path + "': " + e.what());
      return exit_codes::kUsage;
    }
    if (!hooked) {
      say(std::string(method_flag) + ": '" + *path +
          "' does not link lspawn's forkserver hook (lspawn::runtime or lspawn::forkserver_hook; "
          "no " + kForkserverNoteSection + " section); use --start-method exec");
      return exit_codes::kUsage;
    }
  }
  // 2. The log directory.
  if (!o.log_dir.empty()) {
    try {
      make_dirs(o.log_dir);
    } catch (const sys::SysError& e) {
      say("--log-dir " + o.log_dir + ": cannot create it (" + e.what() + ")");
      return exit_codes::kUsage;
    }
  }
  // 3. The job's secret (docs/security.md): lspawn's own LSPAWN_JOB_SECRET when given (a multi-node
  // job needs the same one on every node; it is never sent over the nodes' control channel, which
  // any peer can reach), else a fresh one for a single-node run.
  std::string job_secret;
  try {
    if (auto given = job_secret_from_environment()) {
      job_secret = *given;
    } else if (o.nnodes == 1) {
      job_secret = generate_job_secret();
    } else if (!o.quiet) {
      say("--nnodes " + (o.min_nnodes > 0 ? std::to_string(o.min_nnodes) + ":" : std::string()) + std::to_string(o.nnodes) + " without LSPAWN_JOB_SECRET: the store records of this job are "
          "not authenticated; export the same secret on every node (e.g. LSPAWN_JOB_SECRET=$(openssl rand -hex 32))");
    }
  } catch (const std::exception& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  // 4. The nodes meet (one node: the rendezvous port is reserved for the whole run).
  const std::string host = sys::hostname();
  node::GroupOptions go;
  go.nnodes = o.nnodes;
  go.min_nnodes = o.min_nnodes;
  go.last_call = std::chrono::milliseconds(static_cast<long long>(o.last_call_s * 1000));
  go.nproc_per_node = o.nproc_per_node;
  go.max_restarts = o.max_restarts;
  go.run_id = o.run_id;
  go.host = host;
  go.local_addr = o.local_addr;
  go.node_timeout = std::chrono::milliseconds(static_cast<long long>(o.node_timeout_s * 1000));
  go.rdzv_timeout = std::chrono::milliseconds(static_cast<long long>(o.rdzv_timeout_s * 1000));
  if (!o.quiet) go.info = say;
  // Hang diagnosis across nodes: handled once the watch and the supervisor exist (below).
  std::function<void(int, const node::Message&)> on_hang_message;
  go.on_hang_message = [&on_hang_message](int from, const node::Message& m) {
    if (on_hang_message) on_hang_message(from, m);
  };
  if (o.nnodes > 1 && !o.rdzv_endpoint.empty()) {
    go.static_mode = false;
    go.endpoint_addr = o.rdzv_host;
    go.endpoint_port = o.rdzv_port;
    go.node_rank = o.node_rank_given ? o.node_rank : -1;
  } else {
    go.static_mode = true;
    go.endpoint_addr = o.master_addr;
    go.endpoint_port = o.master_port;
    go.node_rank = o.node_rank;
  }
  std::unique_ptr<node::Group> group;
  try {
    group = node::Group::form(go, o.master_port);
  } catch (const PortError& e) {
    if (o.nnodes > 1 || o.master_port != 0) {
      say("--master-port " + std::to_string(o.master_port) + ": " + e.what());
    } else {
      say("--master-addr " + o.master_addr + ": no free port could be reserved: " + e.what());
    }
    return exit_codes::kUsage;
  } catch (const node::RendezvousError& e) {
    say(e.what());
    return exit_codes::kRendezvous;
  } catch (const sys::SysError& e) {
    say(std::string("rendezvous: ") + e.what());
    return exit_codes::kRendezvous;
  }
  // An elastic job's assignment changes between rounds (node rank, node count): read it there.
  const node::AssignMsg& assign = group->assignment();
  const bool multi = o.nnodes > 1;
  int node_rank = assign.node_rank;

  env::JobEnv job;
  job.master_addr = assign.master_addr;
  job.master_port = assign.master_port;
  job.run_id = assign.run_id;
  job.max_restarts = o.max_restarts;
  job.job_secret = job_secret;
  job.bind_addr = o.bind_addr;
  job.role_name = o.role;
  job.virtual_local_rank = o.virtual_local_rank;
  RunDir run_dir;
  run_dir.path = sys::make_temp_dir("lspawn-" + job.run_id.substr(0, 32) + "-");
  job.run_dir = run_dir.path;
  // The ranks' status records (docs/hang-diagnosis.md); the O_PATH handle lets `lspawn status PID`
  // find it through /proc/PID/fd.
  const std::string status_dir = run_dir.path + "/" + kStatusDirName;
  sys::make_dir(status_dir, 0700);
  const sys::Fd status_dir_handle = sys::open_directory_handle(status_dir);
  HangWatchOptions hopts;
  hopts.dir = status_dir;
  hopts.timeout = std::chrono::milliseconds(static_cast<long long>(o.hang_timeout_s * 1000));
  // Multi-node: the coordinator's watch covers every node's ranks (their launchers send their
  // records) and alone decides a hang; the others report on request only (SIGURG: their ranks).
  if (multi && !group->coordinator()) hopts.timeout = std::chrono::milliseconds(0);
  hopts.ask_remote_stacks = [&group](int node, const std::vector<int>& ranks) {
    node::StackAskMsg ask;
    ask.restart_count = group->round();
    ask.ranks = ranks;
    group->send_hang_message(node, "stacks?", node::body_of(ask));
  };
  hopts.print = [](const std::string& text) {
    try {
      sys::write_all(2, text, "stderr");
    } catch (const sys::SysError&) {
    }
  };
  HangWatch hang_watch(std::move(hopts));

  const auto base_env = env::current_environment();
  if (!o.quiet && env::needs_omp_default(base_env, o.nproc_per_node)) {
    say("setting OMP_NUM_THREADS=1 for each of the " + std::to_string(o.nproc_per_node) +
        " workers of this node to avoid oversubscribing the CPU; set OMP_NUM_THREADS to override");
  }

  std::unique_ptr<ConsoleSink> console;
  std::unique_ptr<LogDirSink> logs;
  std::unique_ptr<FilteredCopySink> filtered;
  SupervisorOptions sopts;
  const bool routed = o.redirects || o.tee_spec || o.local_ranks_filter;
  ConsoleSink::Options co;
  co.prefix = o.prefix;
  if (multi) co.host = host;
  if (!o.log_line_prefix_template.empty()) {
    // torchrun's --log-line-prefix-template; a rank's local rank is rank % nproc on every node.
    co.prefix_of = [tmpl = o.log_line_prefix_template, role = o.role, nproc = o.nproc_per_node, host](int rank) {
      return expand_prefix_template(tmpl, PrefixFields{role, rank, rank % nproc, host});
    };
  }
  if (o.log_dir.empty() || o.tee || routed) {
    console = std::make_unique<ConsoleSink>(co);
    sopts.sinks.push_back(console.get());
  }
  if (!o.log_dir.empty()) {
    logs = std::make_unique<LogDirSink>(o.log_dir, say);
    sopts.sinks.push_back(logs.get());
  }
  // torchrun's --redirects/--tee and --local-ranks-filter decide, per local rank and stream,
  // console, files or both.
  std::vector<std::unique_ptr<RoutedSink>> routes;
  if (routed) {
    const StdSpec redirects = o.redirects.value_or(StdSpec{});
    StdSpec tee = o.tee_spec.value_or(StdSpec{});
    if (!o.tee_spec && o.tee) tee.all = 3;  // the boolean --tee: every stream
    const int nproc = o.nproc_per_node;  // every node runs as many: the local rank is rank % nproc
    const auto filter = o.local_ranks_filter;
    auto route = [=](int rank, Stream s) {
      const StdRoute r = std_route(redirects, tee, rank % nproc, s == Stream::Stderr);
      return filter ? filter_route(r, *filter, rank % nproc) : r;
    };
    sopts.sinks.clear();
    routes.push_back(std::make_unique<RoutedSink>(*console, [route](int r, Stream s) { return route(r, s).console; }));
    if (logs) {
      routes.push_back(std::make_unique<RoutedSink>(*logs, [route](int r, Stream s) { return route(r, s).file; }));
      // A failed rank whose output is not on the console: the report says where it is.
      sopts.output_note = [route, &logs](int rank) {
        std::string files;
        for (Stream s : {Stream::Stdout, Stream::Stderr}) {
          const StdRoute r = route(rank, s);
          const std::string path = logs->path(rank, s);
          if (r.file && !r.console && ::access(path.c_str(), F_OK) == 0) files += (files.empty() ? "" : ", ") + path;
        }
        return files.empty() ? std::string() : "its output, not on the console: " + files;
      };
    }
    for (auto& r : routes) sopts.sinks.push_back(r.get());
  }
  if (!o.filtered_dir.empty()) {
    // Every line of every local rank is matched, wherever --redirects/--tee send it; the copies
    // carry the console's prefix even under --no-prefix, as one file holds every rank.
    ConsoleSink::Options fo = co;
    fo.prefix = true;
    try {
      filtered = std::make_unique<FilteredCopySink>(o.filtered_dir, o.duplicate_filters[0], o.duplicate_filters[1],
                                                    [fo](int rank) { return console_prefix(fo, rank); }, say);
    } catch (const sys::SysError& e) {
      say("--duplicate-stdout/stderr-filters: " + std::string(e.what()));
      return exit_codes::kUsage;
    }
    sopts.sinks.push_back(filtered.get());
  }
  sopts.grace_period = std::chrono::milliseconds(static_cast<long long>(o.grace_period_s * 1000));
  sopts.forward_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  sopts.report_signals = {kReportSignal};
  sopts.on_report_signal = [&hang_watch](int) { hang_watch.request_report(); };
  if (!o.quiet) sopts.on_info = say;
  sopts.world_size = assign.nnodes * o.nproc_per_node;
  sopts.host = host;
  sopts.run_dir = run_dir.path;

  Supervisor sup(std::move(sopts));
  on_hang_message = [&](int from, const node::Message& m) {
    try {
      if (m.type == "status") {
        auto st = m.as<node::StatusMsg>();
        if (group->coordinator() && st.restart_count == group->round()) hang_watch.set_remote(from, std::move(st.ranks));
      } else if (m.type == "stacks?") {
        const auto ask = m.as<node::StackAskMsg>();
        if (ask.restart_count != group->round()) return;
        hang_watch.ask_stacks_for(ask.ranks, sup.results(), [&group, from, round = ask.restart_count](std::vector<RankInput> a) {
          node::StacksMsg answer;
          answer.restart_count = round;
          answer.ranks = std::move(a);
          group->send_hang_message(from, "stacks", node::body_of(answer));
        });
      } else if (m.type == "stacks") {
        hang_watch.add_remote_stacks(m.as<node::StacksMsg>().ranks);
      }
    } catch (const node::BadMessage& e) {
      say("ignored a malformed '" + m.type + "' message from node " + std::to_string(from) + ": " + e.what());
    }
  };
  // A member sends its ranks' records to the coordinator when they changed (at most every
  // kStatusEvery) and at least every kStatusRefresh.
  constexpr auto kStatusEvery = std::chrono::milliseconds(250);
  constexpr auto kStatusRefresh = std::chrono::milliseconds(1000);
  Clock::time_point next_status{}, status_sent{};
  node::Body last_status;
  auto send_status = [&](int round) {
    if (!multi || group->coordinator()) return;
    const auto now = Clock::now();
    if (now < next_status) return;
    next_status = now + kStatusEvery;
    node::StatusMsg st;
    st.restart_count = round;
    st.ranks = hang_watch.collect_inputs(sup.results());
    for (auto& in : st.ranks) in.host = host;
    node::Body j = node::body_of(st);
    if (j == last_status && now - status_sent < kStatusRefresh) return;
    group->send_hang_message(assign.coordinator, "status", j);
    last_status = std::move(j);
    status_sent = now;
  };
  if (!o.quiet) {
    say("starting " + std::to_string(o.nproc_per_node) + " worker" +
        (o.nproc_per_node == 1 ? "" : "s") + " of '" + *path +
        (preloading ? " " + o.program[1] + "' (preloaded: " + preload_modules + ")" : "'") +
        (o.start_method == CliStartMethod::Warm ? " by warm forkserver" : use_forkserver ? " by forkserver" : "") + " (node " + std::to_string(node_rank) + "/" +
        std::to_string(assign.nnodes) + (multi ? " on " + host : "") + ", master " +
        assign.master_addr + ":" + std::to_string(assign.master_port) + ", run id " + job.run_id + ")");
  }
  auto specs_for = [&](int restart_count) {
    job.restart_count = restart_count;
    std::vector<ExecSpec> specs;
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      env::WorkerPlace place{lr, o.nproc_per_node, node_rank, assign.nnodes};
      ExecSpec spec;
      spec.path = *path;
      spec.argv = o.program;
      spec.env = env::worker_environment(job, place, base_env);
      spec.error_file = env::error_file_path(job.run_dir, place.rank());
      ::unlink(spec.error_file.c_str());  // a report of an earlier attempt is not this one's
      set_env(spec.env, status::kDirEnv, status_dir);
      if (preloading) set_env(spec.env, preload::kArgvEnv, preload::worker_argv(o.program));
      specs.push_back(std::move(spec));
    }
    return specs;
  };
  std::vector<ExecSpec> specs = specs_for(0);

  // --start-method forkserver: the program, executed once, forks the workers (declared after
  // the supervisor: destroyed first, it closes the server's socket and reaps it).
  std::unique_ptr<Forkserver> forkserver;
  std::optional<ForkedWorkers> forked;
  if (use_forkserver) {
    std::vector<std::vector<std::string>> envs;
    for (const auto& spec : specs) envs.push_back(spec.env);
    sigset_t stop;
    sigemptyset(&stop);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&stop, sig);
    // Loading the program blocks this thread (no heartbeats): the other nodes allow for it.
    group->announce_busy(kForkserverReadyTimeout + std::chrono::seconds(5));
    try {
      if (o.start_method == CliStartMethod::Warm) forkserver = warm_forkserver(o, *path, server_argv, envs, &stop);
      if (!forkserver) {
        std::vector<std::string> env = common_environment(envs);
        const std::string argv_var = std::string(preload::kArgvEnv) + "=";  // each worker gets its own
        env.erase(std::remove_if(env.begin(), env.end(),
                                 [&](const std::string& kv) { return kv.compare(0, argv_var.size(), argv_var) == 0; }),
                  env.end());
        forkserver = Forkserver::exec(*path, server_argv, env, kForkserverReadyTimeout, &stop);
      }
      forked.emplace(*forkserver, sup, "rank", say);
    } catch (const ForkserverInterrupted& e) {
      say(std::string("interrupted by ") + sys::signal_name(e.signal()) +
          " while the forkserver started; no worker was started");
      return 128 + e.signal();
    } catch (const std::exception& e) {
      say(std::string(method_flag) + ": " + e.what());
      return 1;
    }
  }

  // The channel's fds are events of the supervisor's loop (re-synced: a lost node's goes).
  std::vector<int> watched;
  auto sync_watches = [&] {
    for (int fd : watched) sup.unwatch_fd(fd);
    watched = group->fds();
    for (int fd : watched) sup.watch_fd(fd, POLLIN, [&group, fd](short) { group->on_readable(fd); });
  };
  bool hang = false;  // the hang watchdog stopped this node's workers (this round)
  int restarts_before = 0;  // restarts_used() when the last round began
  auto attempt_text = [&](int round) {
    return multi ? "lspawn:   on node " + std::to_string(node_rank) + " of " +
                       std::to_string(assign.nnodes) + " (" + host + "), attempt " +
                       std::to_string(round) + "\n"
                 : std::string();
  };
  // This node's failure as the group's root cause candidate.
  auto local_cause = [&](int round) {
    node::Cause c;
    c.restart_count = round;
    c.node_rank = node_rank;
    c.host = host;
    if (hang) {  // the watchdog stopped this node's workers (its report is printed already)
      c.kind = "hang";
      c.exit_code = exit_codes::kHang;
      c.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
      std::ostringstream secs;
      secs << o.hang_timeout_s;
      // Multi-node: the report travels with the cause (the other nodes print it too).
      c.text = (multi ? hang_watch.last_report() : std::string()) +
               "lspawn: root cause: no rank made progress in its collectives for " + secs.str() +
               " s on node " + std::to_string(node_rank) + " (" + host + "): stopped by the hang watchdog "
               "(--hang-timeout; the report is above)\n";
      return c;
    }
    // A signal to this lspawn first; else this node's earliest failure of a worker, also one
    // that failed while being stopped for another node (its report may be the job's earliest).
    const std::optional<int> first = sup.stop_signal() ? std::nullopt : sup.earliest_failure();
    if (first) {
      const WorkerResult& r = sup.result(*first);
      c.kind = "worker";
      c.rank = r.rank;
      c.exit_code = Supervisor::failure_exit_code(r);
      c.time_us = r.failure_time_us();
      c.text = sup.failure_report(r.rank) + attempt_text(round);
    } else {
      const int sig = sup.stop_signal();
      c.kind = "signal";
      c.exit_code = 128 + sig;
      c.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
      c.text = multi ? "lspawn: root cause: lspawn on node " + std::to_string(node_rank) + " (" +
                           host + ") received " + sys::signal_name(sig) + "\n"
                     : "lspawn: stopped by " + sys::signal_name(sig) + "\n";
    }
    return c;
  };

  for (bool first = true;; first = false) {
    const int round = group->round();
    node_rank = assign.node_rank;
    // Each attempt its own log files (a joiner's first round may be a later one).
    if (logs) logs->set_attempt(round);
    if (filtered) filtered->set_attempt(round);
    if (!first) {
      sup.new_round(assign.nnodes * o.nproc_per_node);
      const std::string workers = std::to_string(o.nproc_per_node) + " worker" + (o.nproc_per_node == 1 ? "" : "s");
      std::string place = group->elastic() ? " (node " + std::to_string(node_rank) + " of " +
                                                 std::to_string(assign.nnodes) + ")"
                                           : "";
      if (logs) place += ", log files " + o.log_dir + "/rank<N>.attempt" + std::to_string(round) + ".std{out,err}";
      if (!o.quiet && group->restarts_used() == restarts_before) {
        say("round " + std::to_string(round) + ": starting " + workers + place);
      } else if (!o.quiet) {
        say("restart " + std::to_string(group->restarts_used()) + " of " + std::to_string(o.max_restarts) +
            ": starting " + workers + place);
      }
    }
    if (!first || round > 0) specs = specs_for(round);
    restarts_before = group->restarts_used();
    sync_watches();
    try {
      for (size_t lr = 0; lr < specs.size(); ++lr) {
        const ExecSpec& spec = specs[lr];
        const int rank = node_rank * o.nproc_per_node + static_cast<int>(lr);
        if (forked) {
          proto::SpawnCall call;
          call.index = rank;
          forked->start(rank, call, spec.env, spec.error_file);
        } else {
          sup.start_exec(rank, spec);
        }
        sup.step(Clock::now());  // handle events (signals, early exits) between starts
        // Stopping already (a signal, an early failure, another node's): start no more.
        if (sup.root_cause() || sup.stop_signal() || group->stop_requested()) break;
      }
    } catch (const std::exception& e) {
      say(std::string("internal error while starting workers: ") + e.what());
      sup.kill_now();
      if (forked) {
        forked->unwatch();
        forkserver.reset();  // kills and reaps what it forked: report those exits now
        forked->report_all_killed();
      }
      sup.run();
      return exit_codes::kInternal;
    }
    const int started = static_cast<int>(sup.results().size());
    if (started < o.nproc_per_node) {
      const int first = node_rank * o.nproc_per_node + started;
      const int last = node_rank * o.nproc_per_node + o.nproc_per_node - 1;
      say("rank " + std::to_string(first) + (last > first ? ".." + std::to_string(last) : "") +
          " not started: the run was already stopping");
    }

    // The round: local events go to the group, the group's decisions come back.
    bool failure_sent = false, done_sent = false;
    std::optional<int> next_round;
    for (;;) {
      // Local events first (the workers may all have exited while they were being started).
      if (!failure_sent && (sup.root_cause() || sup.stop_signal() || hang)) {
        group->local_failure(local_cause(round));
        failure_sent = true;
      }
      if (group->stop_requested() && sup.phase() == Phase::Running) sup.stop_workers();
      if (sup.finished() && !done_sent) {
        done_sent = true;
        const bool failed = sup.stop_signal() || sup.earliest_failure() || hang;
        group->local_done(failed, failed ? local_cause(round) : node::Cause{});
      }
      next_round = group->take_start();
      if (group->finish() || next_round) break;
      sync_watches();
      if (!sup.finished()) {
        send_status(round);
        const auto watch_due = hang_watch.next_deadline();
        sup.step(std::min({group->next_wakeup(), watch_due, multi && !group->coordinator() ? next_status : Clock::time_point::max()}));
        if (Clock::now() >= watch_due && hang_watch.poll(Clock::now(), sup.results()) && !sup.finished() &&
            !sup.root_cause()) {
          hang = true;
          sup.terminate(SIGTERM, "the hang watchdog (--hang-timeout)");
        }
      } else if (group->wait(Clock::time_point::max(), sup.signal_fd())) {
        for (int sig : sup.take_signals()) {
          if (sig == SIGUSR1 || sig == SIGUSR2) continue;
          say("received " + sys::signal_name(sig) + " while waiting for the other nodes");
          if (!failure_sent) {
            node::Cause c;
            c.kind = "signal";
            c.restart_count = round;
            c.node_rank = node_rank;
            c.host = host;
            c.exit_code = 128 + sig;
            c.text = "lspawn: root cause: lspawn on node " + std::to_string(node_rank) + " (" + host +
                     ") received " + sys::signal_name(sig) + "\n";
            group->local_failure(c);
            failure_sent = true;
          }
        }
      }
      group->tick();
    }
    if (next_round) {
      hang = false;
      hang_watch.clear_remote();
      continue;
    }
    // The job is over: every node prints the same root cause and exits with its code.
    sup.run();  // a member told to finish early still reaps what it started
    if (forked) forked->unwatch();
    group->flush_for(std::chrono::milliseconds(1000));
    const node::FinishMsg& fin = *group->finish();
    std::string summary;
    if (!multi) {
      summary = sup.summary();
    } else if (fin.failed) {
      summary = fin.cause.text;
      // This node's own hang: its report is printed already; the root-cause line only.
      if (fin.cause.kind == "hang" && fin.cause.node_rank == node_rank &&
          summary.compare(0, hang_watch.last_report().size(), hang_watch.last_report()) == 0) {
        summary.erase(0, hang_watch.last_report().size());
      }
      const bool ours = fin.cause.kind == "worker" && fin.cause.node_rank == node_rank;
      if (ours && sup.root_cause() && *sup.root_cause() == fin.cause.rank) {
        summary += sup.summary(false);
      } else {
        if (!ours && sup.root_cause()) {
          // This node's first failure came after the job's root cause (a consequence of it).
          summary += "lspawn: also " + sup.result(*sup.root_cause()).describe() + " on " + host + "\n";
        }
        // summary(false) of a node without a root cause of its own lists every worker, the
        // job's root cause among them when it ran here.
        summary += sup.summary(false);
      }
    } else {
      summary = sup.summary();
    }
    if (!summary.empty()) {
      try {
        sys::write_all(2, summary, "stderr");
      } catch (const sys::SysError&) {
      }
    }
    const int code = multi ? fin.exit_code : hang && !sup.root_cause() ? exit_codes::kHang : sup.exit_code();
    if (!o.result_file.empty()) write_result_file(o.result_file, sup, code, hang);
    return code;
  }
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
  // Flags + what Slurm / a PyTorchJob say about this node (explicit flags win).
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
  // Then torchrun's conventions: a gpu|cpu|auto count, the Python program, the log files.
  if (auto code = apply_torchrun_conventions(o)) return *code;
  try {
    return run(o);
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
    return exit_codes::kInternal;
  }
}

}  // namespace lspawn
