#include "launcher/cli.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include <signal.h>
#include <sys/stat.h>

#include "launcher/cli_options.hpp"
#include "launcher/elf.hpp"
#include "launcher/env_contract.hpp"
#include "launcher/job_secret.hpp"
#include "launcher/output.hpp"
#include "launcher/port.hpp"
#include "launcher/spawn/errors.hpp"
#include "launcher/spawn/forked_workers.hpp"
#include "launcher/spawn/forkserver.hpp"
#include "launcher/spawn/forkserver_hook.hpp"
#include "launcher/supervisor.hpp"
#include "launcher/sys.hpp"
#include "launcher/version.hpp"

namespace lspawn {
namespace {

void say(const std::string& line) {
  std::string s = "lspawn: " + line + "\n";
  try {
    sys::write_all(2, s, "stderr");
  } catch (const sys::SysError&) {
  }
}

std::string random_run_id() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

// Removes the private run directory on every way out of run_cli.
struct RunDir {
  std::string path;
  ~RunDir() {
    if (!path.empty()) sys::remove_tree(path);
  }
};

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

int run(const CliOptions& o) {
  // 1. The program: found and executable, before anything is started.
  int err = 0;
  const auto path = sys::find_executable(o.program[0], &err);
  if (!path) {
    say("cannot execute '" + o.program[0] + "': " + std::strerror(err));
    return err == ENOENT ? exit_codes::kNotFound : exit_codes::kCannotExecute;
  }
  const bool use_forkserver = o.start_method == CliStartMethod::Forkserver;
  if (use_forkserver) {
    bool hooked = false;
    try {
      hooked = elf::has_section(*path, kForkserverNoteSection);
    } catch (const sys::SysError& e) {
      say(std::string("--start-method forkserver: cannot read '") + *path + "': " + e.what());
      return exit_codes::kUsage;
    }
    if (!hooked) {
      say("--start-method forkserver: '" + *path +
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
  // 3. The rendezvous port: reserved for the whole run on the master node.
  std::optional<PortReservation> port;
  int master_port = o.master_port;
  if (o.node_rank == 0) {
    try {
      port.emplace(o.master_addr, o.master_port);
      master_port = port->port();
    } catch (const PortError& e) {
      if (o.master_port != 0) {
        say("--master-port " + std::to_string(o.master_port) + ": " + e.what());
      } else {
        say("--master-addr " + o.master_addr + ": no free port could be reserved: " + e.what());
      }
      return exit_codes::kUsage;
    }
  }

  env::JobEnv job;
  // The job's secret (docs/security.md): lspawn's own LSPAWN_JOB_SECRET when given (a multi-node
  // job needs the same one on every node), else a fresh one for a single-node run.
  try {
    if (auto given = job_secret_from_environment()) {
      job.job_secret = *given;
    } else if (o.nnodes == 1) {
      job.job_secret = generate_job_secret();
    } else if (!o.quiet) {
      say("--nnodes " + std::to_string(o.nnodes) + " without LSPAWN_JOB_SECRET: the store records of this job are "
          "not authenticated; export the same secret on every node (e.g. LSPAWN_JOB_SECRET=$(openssl rand -hex 32))");
    }
  } catch (const std::exception& e) {
    say(e.what());
    return exit_codes::kUsage;
  }
  job.bind_addr = o.bind_addr;
  job.master_addr = o.master_addr;
  job.master_port = master_port;
  job.run_id = o.run_id.empty() ? random_run_id() : o.run_id;
  RunDir run_dir;
  run_dir.path = sys::make_temp_dir("lspawn-" + job.run_id.substr(0, 32) + "-");
  job.run_dir = run_dir.path;

  const auto base_env = env::current_environment();
  if (!o.quiet && env::needs_omp_default(base_env, o.nproc_per_node)) {
    say("setting OMP_NUM_THREADS=1 for each of the " + std::to_string(o.nproc_per_node) +
        " workers of this node to avoid oversubscribing the CPU; set OMP_NUM_THREADS to override");
  }

  std::unique_ptr<ConsoleSink> console;
  std::unique_ptr<LogDirSink> logs;
  SupervisorOptions sopts;
  if (o.log_dir.empty() || o.tee) {
    console = std::make_unique<ConsoleSink>([&] {
      ConsoleSink::Options co;
      co.prefix = o.prefix;
      return co;
    }());
    sopts.sinks.push_back(console.get());
  }
  if (!o.log_dir.empty()) {
    logs = std::make_unique<LogDirSink>(o.log_dir, say);
    sopts.sinks.push_back(logs.get());
  }
  sopts.grace_period = std::chrono::milliseconds(static_cast<long long>(o.grace_period_s * 1000));
  sopts.forward_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  if (!o.quiet) sopts.on_info = say;
  sopts.world_size = o.nnodes * o.nproc_per_node;

  Supervisor sup(std::move(sopts));
  if (!o.quiet) {
    say("starting " + std::to_string(o.nproc_per_node) + " worker" +
        (o.nproc_per_node == 1 ? "" : "s") + " of '" + *path + "'" +
        (use_forkserver ? " by forkserver" : "") + " (node " + std::to_string(o.node_rank) + "/" +
        std::to_string(o.nnodes) + ", master " + o.master_addr + ":" +
        std::to_string(master_port) + ", run id " + job.run_id + ")");
  }
  std::vector<ExecSpec> specs;
  for (int lr = 0; lr < o.nproc_per_node; ++lr) {
    env::WorkerPlace place{lr, o.nproc_per_node, o.node_rank, o.nnodes};
    ExecSpec spec;
    spec.path = *path;
    spec.argv = o.program;
    spec.env = env::worker_environment(job, place, base_env);
    spec.error_file = env::error_file_path(job.run_dir, place.rank());
    specs.push_back(std::move(spec));
  }

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
    try {
      forkserver = Forkserver::exec(*path, o.program, common_environment(envs),
                                    kForkserverReadyTimeout, &stop);
      forked.emplace(*forkserver, sup, "rank", say);
    } catch (const ForkserverInterrupted& e) {
      say(std::string("interrupted by ") + sys::signal_name(e.signal()) +
          " while the forkserver started; no worker was started");
      return 128 + e.signal();
    } catch (const std::exception& e) {
      say(std::string("--start-method forkserver: ") + e.what());
      return 1;
    }
  }
  try {
    for (size_t lr = 0; lr < specs.size(); ++lr) {
      const ExecSpec& spec = specs[lr];
      const int rank = o.node_rank * o.nproc_per_node + static_cast<int>(lr);
      if (forked) {
        proto::SpawnCall call;
        call.set_index(rank);
        forked->start(rank, call, spec.env, spec.error_file);
      } else {
        sup.start_exec(rank, spec);
      }
      sup.step(Clock::now());  // handle events (signals, early exits) between starts
      // Stopping already (a signal, an early failure): start no more.
      if (sup.root_cause() || sup.stop_signal()) break;
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
    const int first = o.node_rank * o.nproc_per_node + started;
    const int last = o.node_rank * o.nproc_per_node + o.nproc_per_node - 1;
    say("rank " + std::to_string(first) + (last > first ? ".." + std::to_string(last) : "") +
        " not started: the run was already stopping");
  }
  sup.run();
  if (forked) forked->unwatch();
  const std::string summary = sup.summary();
  if (!summary.empty()) {
    try {
      sys::write_all(2, summary, "stderr");
    } catch (const sys::SysError&) {
    }
  }
  return sup.exit_code();
}

}  // namespace

int run_cli(const std::vector<std::string>& args) {
  CliOptions o;
  try {
    o = parse_cli(args);
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
  try {
    return run(o);
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
    return exit_codes::kInternal;
  }
}

}  // namespace lspawn
