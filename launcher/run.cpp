#include "launcher/run.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <poll.h>
#include <signal.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cluster/node_group.hpp"
#include "cluster/round.hpp"
#include "daemon/daemon.hpp"
#include "daemon/daemon_client.hpp"
#include "hang/hang_watch.hpp"
#include "hang/status_command.hpp"
#include "launcher/python_preload.hpp"
#include "launcher/python_site.hpp"
#include "launcher/run_output.hpp"
#include "launcher/say.hpp"
#include "placement/binding.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "spawn/elf.hpp"
#include "spawn/forked_workers.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/forkserver_hook.hpp"
#include "status/layout.hpp"
#include "status/phase.hpp"
#include "supervisor/env_contract.hpp"
#include "sys/exit_codes.hpp"
#include "supervisor/job_secret.hpp"
#include "supervisor/port.hpp"
#include "supervisor/supervisor.hpp"
#include "sys/sys.hpp"

namespace lspawn::cli {
namespace {

// How long an exec'd forkserver may take to load and initialise the program.
constexpr std::chrono::seconds kForkserverReadyTimeout{120};

// Removes the private run directory on every way out of run_job.
struct RunDir {
  std::string path;
  ~RunDir() {
    if (!path.empty()) sys::remove_tree(path);
  }
};

// Removes NAME from an environment list.
void unset_env(std::vector<std::string>& env, const std::string& name) {
  const std::string prefix = name + "=";
  env.erase(std::remove_if(env.begin(), env.end(),
                           [&](const std::string& kv) { return kv.compare(0, prefix.size(), prefix) == 0; }),
            env.end());
}

// Sets NAME=value in an environment list, replacing an inherited NAME.
void set_env(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  unset_env(env, name);
  env.push_back(name + "=" + value);
}

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

// The environment of the daemon's warm forkserver: the workers' common environment minus every
// per-run variable (it outlives this run) and minus what a shell keeps per directory or
// invocation: a run from another directory (or another shell) still finds the warm forkserver;
// each worker gets the run's own values.
std::vector<std::string> warm_environment(const std::vector<std::vector<std::string>>& envs) {
  std::vector<std::string> env = env::without_run_variables(common_environment(envs));
  env.erase(std::remove_if(env.begin(), env.end(),
                           [](const std::string& kv) {
                             const std::string name = kv.substr(0, kv.find('='));
                             return name == status::kDirEnv || name == "PWD" || name == "OLDPWD" || name == "SHLVL" ||
                                    name == "_" || name == preload::kArgvEnv;
                           }),
            env.end());
  return env;
}

// The file's absolute path. An interpreter keeps its symbolic link: a venv's bin/python is one
// (to the base interpreter), and Python finds the venv from the path it was executed by.
std::string absolute_program_path(const std::string& path, bool interpreter) {
  if (!interpreter) {
    char resolved[PATH_MAX];
    if (!::realpath(path.c_str(), resolved)) sys::throw_errno("realpath", path);
    return resolved;
  }
  if (path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (!::getcwd(cwd, sizeof cwd)) sys::throw_errno("getcwd", path);
  return std::string(cwd) + "/" + path;
}

// --start-method warm: a server of the daemon's warm forkserver of the program (executed with
// warm_environment()), with this run's working directory and umask for the workers. Null when
// no daemon runs (said once: the caller starts a cold forkserver). Throws what
// daemon::warm_server throws.
std::unique_ptr<Forkserver> warm_forkserver(const CliOptions& o, const std::string& path,
                                            const std::vector<std::string>& argv,
                                            const std::vector<std::vector<std::string>>& envs, const sigset_t* stop) {
  const std::string socket = o.daemon_socket.empty() ? daemon::default_socket_path() : o.daemon_socket;
  const std::vector<std::string> env = warm_environment(envs);
  const std::string absolute = absolute_program_path(path, !o.preload.empty());
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

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::chrono::milliseconds from_seconds(double s) { return std::chrono::milliseconds(static_cast<long long>(s * 1000)); }

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

// The state of one run, made by its steps in this order. The members are declared in the order
// the steps make them, so that they go in the reverse order on every way out (run.hpp): the
// forkserver before the Supervisor, the Supervisor before its sinks, the status directory's
// handle and then the run directory before the node group. A step that ends the run returns its
// exit status; nullopt: go on.
struct Run {
  explicit Run(const CliOptions& opts) : o(opts), multi(opts.nnodes > 1) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // The steps, in order (run_job()).
  std::optional<int> resolve_program();
  std::optional<int> make_log_dir();
  std::optional<int> settle_job_secret();
  std::optional<int> decide_omp_threads();
  std::optional<int> decide_placement();
  std::optional<int> form_group();
  void make_run_dir();
  void make_hang_watch();
  void read_environment();
  std::optional<int> make_sinks();
  void start_supervisor();
  void say_starting() const;
  std::optional<int> start_forkserver();
  int drive_rounds();
  int print_outcome();

  // Parts of the steps.
  std::optional<int> check_forkserver_hook() const;
  node::NodeGroupOptions group_options();
  std::vector<ExecSpec> specs_for(int restart_count);
  std::unique_ptr<Forkserver> cold_forkserver(const std::vector<std::vector<std::string>>& envs,
                                              const sigset_t* stop) const;
  void begin_round(bool first);
  void say_round() const;
  std::optional<int> start_workers();
  std::optional<int> abandon_start(const std::exception& e);
  bool drive_round();
  void report_local_events();
  void step_workers();
  void take_signals_while_waiting();
  void sync_watches();
  void send_status();
  node::Cause local_cause() const;
  void fill_hang_cause(node::Cause& c) const;
  std::string attempt_text() const;
  std::string outcome_summary(const node::FinishMsg& fin) const;
  void on_hang_message(int from, const node::Message& m);
  void ask_remote_stacks(int node, const std::vector<int>& ranks);
  void send_stacks(int to, int asked_round, std::vector<RankInput> ranks);

  const CliOptions& o;
  const bool multi;  // --nnodes > 1

  // resolve_program(): the program, and what executes it.
  std::string path;              // the program's file
  bool use_forkserver = false;   // --start-method forkserver|warm, --preload
  bool preloading = false;       // --preload
  const char* method_flag = "";  // the flag that asked for the forkserver, for its messages
  // The program executed once as the forkserver: the program itself, or for --preload the Python
  // preload server (python_preload.hpp), which gets the script per worker.
  std::vector<std::string> server_argv;
  std::string preload_modules;  // --preload: what the server imports
  std::string job_secret;       // settle_job_secret(); empty: none (multi-node without one)

  // form_group(): the nodes met. An elastic job's assignment changes between rounds (node
  // rank, node count): read group->assignment() there.
  std::string host;
  std::unique_ptr<node::NodeGroup> group;
  int node_rank = 0;  // this round's, as the group assigned it when the round began

  // make_run_dir(), make_hang_watch(), read_environment().
  env::JobEnv job;
  RunDir run_dir;
  std::string status_dir;     // the ranks' status records (docs/hang-diagnosis.md)
  sys::Fd status_dir_handle;  // O_PATH: `lspawn status PID` finds status_dir through /proc/PID/fd
  std::optional<HangWatch> hang_watch;
  std::vector<std::string> base_env;  // the workers' environment before their own variables
  python_site::Decision python_site;  // a Python program's hang diagnosis in exec mode
  env::OmpDefault omp;                // decide_omp_threads(): OMP_NUM_THREADS's default
  bool omp_per_worker = false;        // with --numa-binding: each worker's own CPU count
  placement::Topology topology;       // decide_placement(): --numa-binding's CPUs per local rank
  std::vector<placement::Placement> placements;

  // make_sinks(), start_supervisor(): the Supervisor writes to `output`'s sinks.
  RunOutput output;
  std::optional<Supervisor> sup;
  Clock::time_point next_status{}, status_sent{};  // send_status()
  node::Body last_status;
  std::map<int, node::Body> remote_status;  // coordinator: each node's last status, as it came

  // The workers' commands (this round's), and the forkserver that forks them (when one does).
  std::vector<ExecSpec> specs;
  std::unique_ptr<Forkserver> forkserver;
  std::optional<ForkedWorkers> forked;

  // The rounds (drive_rounds()).
  int watched = -1;         // the group's fd, watched by the supervisor's loop
  int round = 0;            // group->round() when this round began
  int restarts_before = 0;  // restarts_used() when the last round began
  // This round's hang, local failure and end are the group's (group->hang(),
  // local_failure_sent(), local_done_sent()): they start over with each round take_start() hands out.
};

// The program: found and executable, before anything is started.
std::optional<int> Run::resolve_program() {
  int err = 0;
  const auto found = sys::find_executable(o.program[0], &err);
  if (!found) {
    say("cannot execute '" + o.program[0] + "': " + std::strerror(err));
    return err == ENOENT ? exit_codes::kNotFound : exit_codes::kCannotExecute;
  }
  path = *found;
  use_forkserver = o.start_method == CliStartMethod::Forkserver || o.start_method == CliStartMethod::Warm;
  preloading = !o.preload.empty();
  method_flag = preloading                               ? "--preload"
                : o.start_method == CliStartMethod::Warm ? "--start-method warm"
                                                         : "--start-method forkserver";
  server_argv = o.program;
  if (preloading) {
    try {
      server_argv = preload::server_argv(o.program, o.preload, preload::locate());
    } catch (const std::exception& e) {
      say(std::string(method_flag) + ": " + e.what());
      return exit_codes::kInternal;
    }
    preload_modules = server_argv.back();
  }
  if (use_forkserver && !preloading) return check_forkserver_hook();
  return std::nullopt;
}

// --start-method forkserver|warm: the program links lspawn's forkserver hook.
std::optional<int> Run::check_forkserver_hook() const {
  bool hooked = false;
  try {
    hooked = elf::has_section(path, kForkserverNoteSection);
  } catch (const sys::SysError& e) {
    say(std::string(method_flag) + ": cannot read '" + path + "': " + e.what());
    return exit_codes::kUsage;
  }
  if (!hooked) {
    say(std::string(method_flag) + ": '" + path +
        "' does not link lspawn's forkserver hook (lspawn::runtime or lspawn::forkserver_hook; "
        "no " +
        kForkserverNoteSection + " section); use --start-method exec");
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// The log directory.
std::optional<int> Run::make_log_dir() {
  if (o.log_dir.empty()) return std::nullopt;
  try {
    make_dirs(o.log_dir);
  } catch (const sys::SysError& e) {
    say("--log-dir " + o.log_dir + ": cannot create it (" + e.what() + ")");
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// The job's secret (docs/security.md): lspawn's own LSPAWN_JOB_SECRET when given (a multi-node
// job needs the same one on every node; it is never sent over the nodes' control channel, which
// any peer can reach), else a fresh one for a single-node run.
std::optional<int> Run::settle_job_secret() {
  try {
    if (auto given = job_secret_from_environment()) {
      job_secret = *given;
    } else if (o.nnodes == 1) {
      job_secret = generate_job_secret();
    } else if (!o.quiet) {
      say("--nnodes " + (o.min_nnodes > 0 ? std::to_string(o.min_nnodes) + ":" : std::string()) +
          std::to_string(o.nnodes) +
          " without LSPAWN_JOB_SECRET: the store records of this job are "
          "not authenticated; export the same secret on every node (e.g. LSPAWN_JOB_SECRET=$(openssl rand -hex 32))");
    }
  } catch (const std::exception& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// The nodes meet (one node: the rendezvous port is reserved for the whole run).
std::optional<int> Run::form_group() {
  host = sys::hostname();
  try {
    group = node::NodeGroup::form(group_options(), o.master_port);
  } catch (const PortError& e) {
    if (o.nnodes > 1 || o.master_port != 0) {
      say("--master-port " + std::to_string(o.master_port) + ": " + e.what());
    } else {
      say("--master-addr " + o.master_addr + ": no free port could be reserved: " + e.what());
    }
    return exit_codes::kUsage;
  } catch (const node::NodeRendezvousError& e) {
    say(e.what());
    return exit_codes::kRendezvous;
  } catch (const sys::SysError& e) {
    say(std::string("rendezvous: ") + e.what());
    return exit_codes::kRendezvous;
  }
  node_rank = group->assignment().node_rank;
  return std::nullopt;
}

node::NodeGroupOptions Run::group_options() {
  node::NodeGroupOptions go;
  go.nnodes = o.nnodes;
  go.min_nnodes = o.min_nnodes;
  go.last_call = from_seconds(o.last_call_s);
  go.nproc_per_node = o.nproc_per_node;
  go.max_restarts = o.max_restarts;
  go.no_restart_exit_codes = o.no_restart_exit_codes;
  go.run_id = o.run_id;
  go.host = host;
  go.local_addr = o.local_addr;
  go.node_timeout = from_seconds(o.node_timeout_s);
  go.rdzv_timeout = from_seconds(o.rdzv_timeout_s);
  if (!o.quiet) go.info = say;
  // Hang diagnosis across nodes: handled once the watch and the supervisor exist.
  go.on_hang_message = [this](int from, const node::Message& m) { on_hang_message(from, m); };
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
  return go;
}

// --numa-binding (docs/cli.md, "CPU placement"): the CPUs of each local rank, from the machine's
// topology (placement/), before the group forms: what cannot be placed stops this node alone.
std::optional<int> Run::decide_placement() {
  if (o.numa_binding.empty()) return std::nullopt;
  try {
    topology = placement::read_topology();
    const char* visible = std::getenv(env::kCudaVisibleDevices);
    const std::vector<int> gpus = placement::visible_gpus(topology, visible, std::getenv("CUDA_DEVICE_ORDER"));
    placements = placement::place(topology, *placement::parse_mode(o.numa_binding), o.nproc_per_node, gpus,
                                  placement::current_affinity());
  } catch (const placement::TopologyError& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// The workers' job and the run's private directory (status records, error files).
void Run::make_run_dir() {
  const node::AssignMsg& assign = group->assignment();
  job.master_addr = assign.master_addr;
  job.master_port = assign.master_port;
  job.run_id = assign.run_id;
  job.max_restarts = o.max_restarts;
  job.job_secret = job_secret;
  job.bind_addr = o.bind_addr;
  job.omp_threads = o.omp_threads > 0 ? o.omp_threads : omp.threads;
  job.role_name = o.role;
  job.virtual_local_rank = o.virtual_local_rank;
  run_dir.path = sys::make_temp_dir("lspawn-" + job.run_id.substr(0, 32) + "-");
  job.run_dir = run_dir.path;
  status_dir = run_dir.path + "/" + kStatusDirName;
  sys::make_dir(status_dir, 0700);
  status_dir_handle = sys::open_directory_handle(status_dir);
}

// The hang watchdog over the ranks' status records (--hang-timeout, SIGURG).
void Run::make_hang_watch() {
  HangWatchOptions hopts;
  hopts.dir = status_dir;
  hopts.timeout = from_seconds(o.hang_timeout_s);
  // Multi-node: the coordinator's watch covers every node's ranks (their launchers send their
  // records) and alone decides a hang; the others report on request only (SIGURG: their ranks).
  if (multi && !group->coordinator()) hopts.timeout = std::chrono::milliseconds(0);
  hopts.ask_remote_stacks = [this](int node, const std::vector<int>& ranks) { ask_remote_stacks(node, ranks); };
  hopts.print = write_stderr;
  hang_watch.emplace(std::move(hopts));
}

void Run::read_environment() {
  base_env = env::current_environment();
  // A Python program started by exec gets lspawn_hang through its sitecustomize (python_site.hpp);
  // --preload's server installs it itself, and a forkserver is the program's own.
  if (!use_forkserver) python_site = python_site::decide(o.program, base_env);
  if (o.cpu_backend_lspawn) {
    // Read by lspawn's sitecustomize (exec) and --preload's bootstrap in each Python worker.
    set_env(base_env, "LSPAWN_CPU_BACKEND", "lspawn");
    if (!use_forkserver && !(python_site.python && !python_site.site_dir.empty())) {
      throw UsageError(
          std::string("--cpu-backend lspawn applies to Python workers started with lspawn's site hook or ") +
          "--preload; " + (python_site.python ? python_site.off_why : "the program is not a Python interpreter") +
          " (docs/python-backend.md)");
    }
    say("--cpu-backend lspawn: the workers' torch.distributed gloo groups use lspawn's backend for CPU tensors "
        "(shared memory within a host; docs/python-backend.md)");
  }
  if (python_site.python && python_site.site_dir.empty() && o.hang_timeout_s > 0) {
    say(std::string("--hang-timeout cannot see these Python workers: ") + python_site.off_why +
        ", so they write no status record (docs/hang-diagnosis.md, \"Python workers\")");
  }
  if (!o.quiet && omp.threads > 0) {
    say("setting OMP_NUM_THREADS=" + std::to_string(omp.threads) + " for each of the " +
        workers_text(o.nproc_per_node) + " of this node (its share of " + omp.why +
        "); set OMP_NUM_THREADS or --omp-threads to override");
  }
}

// OMP_NUM_THREADS for the workers (docs/cli.md, "Threads"): --omp-threads, else the variable as
// the user set it, else each worker's share of the CPUs (env::omp_threads_default; said in
// read_environment()). Before the group forms: a bad SLURM_CPUS_PER_TASK stops this node alone.
std::optional<int> Run::decide_omp_threads() {
  if (o.omp_threads > 0) return std::nullopt;
  if (!placements.empty()) {  // each worker's share is its own CPUs (specs_for())
    omp_per_worker = std::getenv(env::kOmpNumThreads) == nullptr;
    return std::nullopt;
  }
  try {
    omp = env::omp_threads_default(env::current_environment(), o.nproc_per_node, placement::usable_cpu_count());
  } catch (const std::invalid_argument& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// The workers' output sinks (run_output.hpp).
std::optional<int> Run::make_sinks() {
  try {
    output = make_run_output(o, host, say);
  } catch (const UsageError& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  return std::nullopt;
}

// The Supervisor (and its guardian); from now on the group's hang messages are handled.
void Run::start_supervisor() {
  SupervisorOptions sopts;
  sopts.sinks = output.sinks;
  sopts.output_note = output.output_note;
  sopts.grace_period = from_seconds(o.grace_period_s);
  sopts.forward_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  sopts.report_signals = {kReportSignal};
  sopts.on_report_signal = [this](int) { hang_watch->request_report(); };
  if (!o.quiet) sopts.on_info = say;
  sopts.world_size = group->assignment().nnodes * o.nproc_per_node;
  sopts.host = host;
  sopts.run_dir = run_dir.path;
  sup.emplace(std::move(sopts));
}

void Run::say_starting() const {
  if (o.quiet) return;
  const node::AssignMsg& assign = group->assignment();
  say("starting " + workers_text(o.nproc_per_node) + " of '" + path +
      (preloading ? " " + o.program[1] + "' (preloaded: " + preload_modules + ")" : "'") +
      (o.start_method == CliStartMethod::Warm ? " by warm forkserver"
       : use_forkserver                       ? " by forkserver"
                                              : "") +
      " (node " + std::to_string(node_rank) + "/" + std::to_string(assign.nnodes) + (multi ? " on " + host : "") +
      ", master " + assign.master_addr + ":" + std::to_string(assign.master_port) + ", run id " + job.run_id + ")");
  if (!placements.empty()) {
    say("--numa-binding " + o.numa_binding + ": " +
        placement::placement_text(topology, placements, node_rank * o.nproc_per_node) +
        (omp_per_worker ? "; OMP_NUM_THREADS = each rank's CPU count" : ""));
  }
}

// The workers of this node for round `restart_count`.
std::vector<ExecSpec> Run::specs_for(int restart_count) {
  job.restart_count = restart_count;
  std::vector<ExecSpec> out;
  for (int lr = 0; lr < o.nproc_per_node; ++lr) {
    env::WorkerPlace place{lr, o.nproc_per_node, node_rank, group->assignment().nnodes};
    ExecSpec spec;
    spec.path = path;
    spec.argv = o.program;
    spec.env = env::worker_environment(job, place, base_env);
    spec.error_file = env::error_file_path(job.run_dir, place.rank());
    ::unlink(spec.error_file.c_str());  // a report of an earlier attempt is not this one's
    set_env(spec.env, status::kDirEnv, status_dir);
    python_site::apply(python_site, spec.env);
    if (!placements.empty()) {
      const placement::CpuList& cpus = placements[static_cast<size_t>(lr)].cpus;
      spec.cpus = cpus;
      set_env(spec.env, env::kLspawnCpus, placement::cpu_list_text(cpus));
      if (omp_per_worker) set_env(spec.env, env::kOmpNumThreads, std::to_string(cpus.size()));
    }
    if (preloading) set_env(spec.env, preload::kArgvEnv, preload::worker_argv(o.program));
    out.push_back(std::move(spec));
  }
  return out;
}

// --start-method forkserver|warm, --preload: the program, executed once, forks the workers.
std::optional<int> Run::start_forkserver() {
  if (!use_forkserver) return std::nullopt;
  std::vector<std::vector<std::string>> envs;
  for (const auto& spec : specs) envs.push_back(spec.env);
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&stop, sig);
  // Loading the program blocks this thread (no heartbeats): the other nodes allow for it.
  group->announce_busy(kForkserverReadyTimeout + std::chrono::seconds(5));
  try {
    if (o.start_method == CliStartMethod::Warm) forkserver = warm_forkserver(o, path, server_argv, envs, &stop);
    if (!forkserver) forkserver = cold_forkserver(envs, &stop);
    forked.emplace(*forkserver, *sup, "rank", say);
  } catch (const ForkserverInterrupted& e) {
    say(std::string("interrupted by ") + sys::signal_name(e.signal()) +
        " while the forkserver started; no worker was started");
    return 128 + e.signal();
  } catch (const std::exception& e) {
    say(std::string(method_flag) + ": " + e.what());
    return 1;
  }
  return std::nullopt;
}

std::unique_ptr<Forkserver> Run::cold_forkserver(const std::vector<std::vector<std::string>>& envs,
                                                 const sigset_t* stop) const {
  std::vector<std::string> env = common_environment(envs);
  unset_env(env, preload::kArgvEnv);  // each worker gets its own
  return Forkserver::exec(path, server_argv, env, kForkserverReadyTimeout, stop);
}

// The rounds: each starts this node's workers and runs until the group decides the next
// round or the end of the job.
int Run::drive_rounds() {
  for (bool first = true;; first = false) {
    begin_round(first);
    if (auto code = start_workers()) return *code;
    if (!drive_round()) return print_outcome();
    hang_watch->clear_remote();
    remote_status.clear();
  }
}

void Run::begin_round(bool first) {
  round = group->round();
  node_rank = group->assignment().node_rank;
  // Each round its own store port in a multi-node job (cluster/node_group.hpp, "fenced").
  job.master_addr = group->assignment().master_addr;
  job.master_port = group->assignment().master_port;
  // Each attempt its own log files (a joiner's first round may be a later one).
  output.set_attempt(round);
  if (!first) {
    sup->new_round(group->assignment().nnodes * o.nproc_per_node);
    say_round();
  }
  if (!first || round > 0) specs = specs_for(round);
  restarts_before = group->restarts_used();
  sync_watches();
}

// "round R: starting ..." (a round that admits a node) or "restart K of MAX: starting ...".
void Run::say_round() const {
  if (o.quiet) return;
  std::string place = group->elastic() ? " (node " + std::to_string(node_rank) + " of " +
                                             std::to_string(group->assignment().nnodes) + ")"
                                       : "";
  if (output.logs) place += ", log files " + o.log_dir + "/rank<N>.attempt" + std::to_string(round) + ".std{out,err}";
  if (group->restarts_used() == restarts_before) {
    say("round " + std::to_string(round) + ": starting " + workers_text(o.nproc_per_node) + place);
  } else {
    say("restart " + std::to_string(group->restarts_used()) + " of " + std::to_string(o.max_restarts) + ": starting " +
        workers_text(o.nproc_per_node) + place);
  }
}

// This round's workers, one by one; none more once the run is stopping. Returns an exit status
// when the run ends here (an internal error).
std::optional<int> Run::start_workers() {
  try {
    for (size_t lr = 0; lr < specs.size(); ++lr) {
      const ExecSpec& spec = specs[lr];
      const int rank = node_rank * o.nproc_per_node + static_cast<int>(lr);
      if (forked) {
        proto::SpawnCall call;
        call.index = rank;
        forked->start(rank, call, spec.env, spec.error_file);
      } else {
        sup->start_exec(rank, spec);
      }
      sup->step(Clock::now());  // handle events (signals, early exits) between starts
      // Stopping already (a signal, an early failure, another node's): start no more.
      if (sup->root_cause() || sup->stop_signal() || group->stop_requested()) break;
    }
  } catch (const std::exception& e) {
    return abandon_start(e);
  }
  const int started = static_cast<int>(sup->results().size());
  if (started < o.nproc_per_node) {
    const int first = node_rank * o.nproc_per_node + started;
    const int last = node_rank * o.nproc_per_node + o.nproc_per_node - 1;
    say("rank " + std::to_string(first) + (last > first ? ".." + std::to_string(last) : "") +
        " not started: the run was already stopping");
  }
  return std::nullopt;
}

// A worker could not be started: every one started is killed and its exit reported.
std::optional<int> Run::abandon_start(const std::exception& e) {
  say(std::string("internal error while starting workers: ") + e.what());
  sup->kill_now();
  if (forked) {
    forked->unwatch();
    forkserver.reset();  // kills and reaps what it forked: report those exits now
    forked->report_all_killed();
  }
  sup->run();
  return exit_codes::kInternal;
}

// The round: local events go to the group, the group's decisions come back. Returns true when
// the group started a next round, false when the job is over.
bool Run::drive_round() {
  for (;;) {
    report_local_events();
    const std::optional<int> next_round = group->take_start();
    if (group->finish() || next_round) return next_round.has_value();
    if (!sup->finished()) {
      step_workers();
    } else if (group->wait(Clock::time_point::max(), sup->signal_fd())) {
      take_signals_while_waiting();
    }
    group->tick();
  }
}

// Local events first (the workers may all have exited while they were being started).
void Run::report_local_events() {
  if (!group->local_failure_sent() && (sup->root_cause() || sup->stop_signal() || group->hang())) {
    group->local_failure(local_cause());
  }
  if (group->stop_requested() && sup->phase() == Phase::Running) sup->stop_workers();
  if (sup->finished() && !group->local_done_sent()) {
    const bool failed = sup->stop_signal() || sup->earliest_failure() || group->hang();
    group->local_done(failed, failed ? local_cause() : node::Cause{});
  }
}

// The workers run: the supervisor's loop until the group, the hang watch or a status send is due.
void Run::step_workers() {
  send_status();
  const auto watch_due = hang_watch->next_deadline();
  sup->step(std::min(
      {group->next_wakeup(), watch_due, multi && !group->coordinator() ? next_status : Clock::time_point::max()}));
  if (Clock::now() >= watch_due && hang_watch->poll(Clock::now(), sup->results()) && !sup->finished() &&
      !sup->root_cause()) {
    group->set_hang();
    sup->terminate(SIGTERM, "the hang watchdog (--hang-timeout)");
  }
}

// This node's workers are done, the other nodes' are not: a signal to lspawn is this node's
// failure (said; SIGUSR1/SIGUSR2 are not).
void Run::take_signals_while_waiting() {
  for (int sig : sup->take_signals()) {
    if (sig == SIGUSR1 || sig == SIGUSR2) continue;
    say("received " + sys::signal_name(sig) + " while waiting for the other nodes");
    if (group->local_failure_sent()) continue;
    node::Cause c;
    c.kind = node::CauseKind::Signal;
    c.restart_count = round;
    c.node_rank = node_rank;
    c.host = host;
    c.exit_code = 128 + sig;
    c.text = "lspawn: root cause: lspawn on node " + std::to_string(node_rank) + " (" + host + ") received " +
             sys::signal_name(sig) + "\n";
    group->local_failure(c);
  }
}

// The channel is one event of the supervisor's loop: the group's fd (an epoll set over every node's link).
void Run::sync_watches() {
  if (watched >= 0) sup->unwatch_fd(watched);
  watched = group->fd();
  sup->watch_fd(watched, POLLIN, [this](short) { group->on_readable(); });
}

// A member sends its ranks' records to the coordinator when they changed, at most every
// status_interval() (node_group.hpp: 250 ms, longer beyond 250 nodes), and unchanged at least
// every max(1 s, heartbeat interval).
void Run::send_status() {
  if (!multi || group->coordinator()) return;
  const auto now = Clock::now();
  if (now < next_status) return;
  next_status = now + group->status_interval();
  node::StatusMsg st;
  st.restart_count = round;
  st.ranks = hang_watch->collect_inputs(sup->results());
  for (auto& in : st.ranks) in.host = host;
  node::Body j = node::body_of(st);
  if (j == last_status &&
      now - status_sent < std::max<Clock::duration>(std::chrono::seconds(1), group->heartbeat_interval()))
    return;
  group->send_hang_message(group->assignment().coordinator, "status", j);
  last_status = std::move(j);
  status_sent = now;
}

// This node's failure as the group's root cause candidate: the hang watchdog's stop; else a
// signal to this lspawn; else this node's earliest failure of a worker, also one that failed
// while being stopped for another node (its report may be the job's earliest).
node::Cause Run::local_cause() const {
  node::Cause c;
  c.restart_count = round;
  c.node_rank = node_rank;
  c.host = host;
  if (group->hang()) {
    fill_hang_cause(c);
    return c;
  }
  const std::optional<int> first = sup->stop_signal() ? std::nullopt : sup->earliest_failure();
  if (first) {
    const WorkerResult& r = sup->result(*first);
    c.kind = node::CauseKind::Worker;
    c.rank = r.rank;
    c.before_rendezvous = status::start_phase(status_dir, r.rank, r.pid) == status::StartPhase::BeforeRendezvous;
    c.exit_code = Supervisor::failure_exit_code(r);
    c.time_us = r.failure_time_us();
    c.text = sup->failure_report(r.rank) + attempt_text();
  } else {
    const int sig = sup->stop_signal();
    c.kind = node::CauseKind::Signal;
    c.exit_code = 128 + sig;
    c.time_us = now_us();
    c.text = multi ? "lspawn: root cause: lspawn on node " + std::to_string(node_rank) + " (" + host + ") received " +
                         sys::signal_name(sig) + "\n"
                   : "lspawn: stopped by " + sys::signal_name(sig) + "\n";
  }
  return c;
}

// The watchdog stopped this node's workers (its report is printed already).
void Run::fill_hang_cause(node::Cause& c) const {
  c.kind = node::CauseKind::Hang;
  c.exit_code = exit_codes::kHang;
  c.time_us = now_us();
  std::ostringstream secs;
  secs << o.hang_timeout_s;
  // Multi-node: the report travels with the cause (the other nodes print it too).
  c.text = (multi ? hang_watch->last_report() : std::string()) +
           "lspawn: root cause: no rank made progress in its collectives for " + secs.str() + " s on node " +
           std::to_string(node_rank) + " (" + host +
           "): stopped by the hang watchdog "
           "(--hang-timeout; the report is above)\n";
}

std::string Run::attempt_text() const {
  return multi
             ? "lspawn:   on node " + std::to_string(node_rank) + " of " + std::to_string(group->assignment().nnodes) +
                   " (" + host + "), attempt " + std::to_string(round) + "\n"
             : std::string();
}

// The job is over: every node prints the same root cause and exits with its code.
int Run::print_outcome() {
  sup->run();  // a member told to finish early still reaps what it started
  if (forked) forked->unwatch();
  // Up to the node timeout (10 s at most) for the last messages to be acknowledged: milliseconds
  // on a LAN, seconds on a slow link; a lost node's link is closed already.
  group->flush_for(std::min(from_seconds(o.node_timeout_s), std::chrono::milliseconds(10000)));
  const node::FinishMsg& fin = *group->finish();
  const std::string summary = outcome_summary(fin);
  if (!summary.empty() && !o.no_summary) write_stderr(summary);
  // After restarts, which attempt failed how (#33), the last one included.
  if (!group->failed_attempts().empty()) {
    std::string line = "lspawn: attempts:";
    for (const std::string& a : group->failed_attempts()) line += " " + a + ";";
    line += " " +
            (fin.failed ? node::attempt_failed_text(fin.restart_count, fin.cause)
                        : "attempt " + std::to_string(fin.restart_count) + " succeeded") +
            "\n";
    write_stderr(line);
  }
  const int code = multi ? fin.exit_code : group->hang() && !sup->root_cause() ? exit_codes::kHang : sup->exit_code();
  if (!o.result_file.empty()) write_result_file(o.result_file, *sup, code, group->hang());
  return code;
}

std::string Run::outcome_summary(const node::FinishMsg& fin) const {
  if (!fin.failed) return sup->summary();
  if (!multi) {  // the supervisor's own summary, and the decision's line about a code not retried
    const size_t at = fin.cause.text.find(node::kNotRestartedLine);
    return sup->summary() +
           (at == std::string::npos ? "" : fin.cause.text.substr(at, fin.cause.text.find('\n', at) + 1 - at));
  }
  std::string summary = fin.cause.text;
  // This node's own hang: its report is printed already; the root-cause line only.
  const std::string& report = hang_watch->last_report();
  if (fin.cause.kind == node::CauseKind::Hang && fin.cause.node_rank == node_rank &&
      summary.compare(0, report.size(), report) == 0) {
    summary.erase(0, report.size());
  }
  const bool ours = fin.cause.kind == node::CauseKind::Worker && fin.cause.node_rank == node_rank;
  if (!ours && sup->root_cause()) {
    // This node's first failure came after the job's root cause (a consequence of it).
    summary += "lspawn: also " + sup->result(*sup->root_cause()).describe() + " on " + host + "\n";
  }
  // summary(false) of a node without a root cause of its own lists every worker, the job's
  // root cause among them when it ran here.
  return summary + sup->summary(false);
}

// Hang diagnosis across nodes (the group's "status", "stacks?" and "stacks"); dropped until
// the Supervisor exists.
void Run::on_hang_message(int from, const node::Message& m) {
  if (!sup) return;
  try {
    if (m.type == "status") {
      // Unchanged records (a member resends them every heartbeat interval) are not decoded again:
      // at thousands of nodes, that decoding was most of the coordinator's own work.
      auto last = remote_status.find(from);
      if (last != remote_status.end() && last->second == m.body) return;
      auto st = m.as<node::StatusMsg>();
      if (!group->coordinator() || st.restart_count != group->round()) return;
      hang_watch->set_remote(from, std::move(st.ranks));
      remote_status[from] = m.body;
    } else if (m.type == "stacks?") {
      const auto ask = m.as<node::StackAskMsg>();
      if (ask.restart_count != group->round()) return;
      hang_watch->ask_stacks_for(ask.ranks, sup->results(),
                                 [this, from, asked = ask.restart_count](std::vector<RankInput> a) {
                                   send_stacks(from, asked, std::move(a));
                                 });
    } else if (m.type == "stacks") {
      hang_watch->add_remote_stacks(m.as<node::StacksMsg>().ranks);
    }
  } catch (const node::BadMessage& e) {
    say("ignored a malformed '" + m.type + "' message from node " + std::to_string(from) + ": " + e.what());
  }
}

void Run::ask_remote_stacks(int node, const std::vector<int>& ranks) {
  node::StackAskMsg ask;
  ask.restart_count = group->round();
  ask.ranks = ranks;
  group->send_hang_message(node, "stacks?", node::body_of(ask));
}

void Run::send_stacks(int to, int asked_round, std::vector<RankInput> ranks) {
  node::StacksMsg answer;
  answer.restart_count = asked_round;
  answer.ranks = std::move(ranks);
  group->send_hang_message(to, "stacks", node::body_of(answer));
}

}  // namespace

int run_job(const CliOptions& o) {
  Run r(o);
  if (auto code = r.resolve_program()) return *code;
  if (auto code = r.make_log_dir()) return *code;
  if (auto code = r.settle_job_secret()) return *code;
  if (auto code = r.decide_placement()) return *code;
  if (auto code = r.decide_omp_threads()) return *code;
  if (auto code = r.form_group()) return *code;
  r.make_run_dir();
  r.make_hang_watch();
  r.read_environment();
  if (auto code = r.make_sinks()) return *code;
  r.start_supervisor();
  r.say_starting();
  r.specs = r.specs_for(0);
  if (auto code = r.start_forkserver()) return *code;
  return r.drive_rounds();
}

}  // namespace lspawn::cli
