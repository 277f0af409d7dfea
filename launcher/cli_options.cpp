#include "launcher/cli_options.hpp"
#include "launcher/python_preload.hpp"
#include "placement/binding.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>

namespace lspawn {
namespace {

constexpr int kMaxProcs = 4096;

[[noreturn]] void usage(const std::string& msg) { throw UsageError(msg); }

// form: the placeholder ("N"); what: what it must be ("a positive integer").
int parse_int(const std::string& opt, const std::string& v, int lo, int hi, const char* form, const char* what) {
  const std::string accepted = " (" + opt + " " + form + ")";
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 9) {
    usage(opt + ": expected " + what + accepted + ", got '" + v + "'");
  }
  const long n = std::strtol(v.c_str(), nullptr, 10);
  if (n < lo || n > hi) {
    usage(opt + ": " + v + " is out of range " + std::to_string(lo) + ".." + std::to_string(hi) + accepted);
  }
  return static_cast<int>(n);
}

double parse_seconds(const std::string& opt, const std::string& v) {
  const std::string accepted = " (" + opt + " SECONDS, a number >= 0, e.g. 5 or 0.5)";
  char* end = nullptr;
  errno = 0;
  const double d = v.empty() ? -1 : std::strtod(v.c_str(), &end);
  if (v.empty() || errno != 0 || *end != '\0' || !std::isfinite(d) || d < 0 || d > 86400 ||
      v.find_first_not_of("0123456789.") != std::string::npos) {
    usage(opt + ": expected a number of seconds >= 0" + accepted + ", got '" + v + "'");
  }
  return d;
}

// The multi-node options (docs/multi-node.md), kept apart from the rest. Returns false when
// `name` is not one of them.
bool parse_multinode_option(const std::string& name, const std::function<std::string(const char*)>& take,
                            CliOptions& o) {
  if (name == "--max-restarts") {
    o.max_restarts = parse_int(name, take("K"), 0, 10000, "K", "an integer >= 0");
  } else if (name == "--no-restart-exit-codes") {
    o.no_restart_exit_codes.clear();
    for (const std::string& c : split_commas(take("CODE[,CODE...]"))) {
      o.no_restart_exit_codes.push_back(
          parse_int(name, c, 0, 255, "CODE[,CODE...]", "exit codes 0..255 separated by commas"));
    }
  } else if (name == "--rdzv-endpoint") {
    o.rdzv_endpoint = take("HOST:PORT");
    std::string host = o.rdzv_endpoint;
    int port = 29400;  // torchrun's default rendezvous port
    const auto colon = host.rfind(':');
    if (colon != std::string::npos && host.find(']') == std::string::npos && host.find(':') == colon) {
      port = parse_int(name, host.substr(colon + 1), 1, 65535, "HOST:PORT", "HOST:PORT with PORT 1..65535");
      host = host.substr(0, colon);
    } else if (!host.empty() && host.front() == '[') {  // [v6]:port
      const auto close = host.find(']');
      if (close == std::string::npos) usage(name + ": expected HOST:PORT or [IPV6]:PORT, got '" + host + "'");
      if (close + 1 < host.size()) {
        if (host[close + 1] != ':') usage(name + ": expected [IPV6]:PORT, got '" + host + "'");
        port = parse_int(name, host.substr(close + 2), 1, 65535, "HOST:PORT", "HOST:PORT with PORT 1..65535");
      }
      host = host.substr(1, close - 1);
    }
    if (host.empty()) usage(name + ": empty host (" + name + " HOST:PORT)");
    o.rdzv_host = host;
    o.rdzv_port = port;
  } else if (name == "--rdzv-backend") {
    const std::string b = take("c10d|static");
    if (b != "c10d" && b != "static") {
      usage(name +
            ": lspawn's own rendezvous replaces c10d and static; accepted values are c10d "
            "and static (" +
            name + " c10d), got '" + b + "'");
    }
  } else if (name == "--hostfile") {
    o.hostfile = take("FILE");
    if (o.hostfile.empty()) usage(name + ": empty path (" + name + " FILE)");
  } else if (name == "--hosts") {
    o.hosts_list = take("HOST[:N],...");
    if (o.hosts_list.empty()) usage(name + ": names no host (" + name + " A[:N],B[:N],...)");
  } else if (name == "--rsh") {
    o.rsh = take("CMD");
    if (o.rsh.find_first_not_of(" \t") == std::string::npos)
      usage(name + ": empty command (" + name + " CMD, e.g. ssh)");
  } else if (name == "--node-timeout") {
    o.node_timeout_s = parse_seconds(name, take("SECONDS"));
    if (o.node_timeout_s < 0.1) usage(name + ": must be at least 0.1 s, got " + std::to_string(o.node_timeout_s));
  } else if (name == "--rdzv-timeout") {
    o.rdzv_timeout_s = parse_seconds(name, take("SECONDS"));
    if (o.rdzv_timeout_s < 0.1) usage(name + ": must be at least 0.1 s, got " + std::to_string(o.rdzv_timeout_s));
  } else {
    return false;
  }
  return true;
}

// torchrun's short options: -m, -r SPEC / -rSPEC, -t SPEC / -tSPEC as their long forms.
// nullopt: not one of them.
std::optional<std::string> torchrun_short_option(const std::string& a) {
  if (a == "-m") return std::string("--module");
  if (a.size() >= 2 && (a[1] == 'r' || a[1] == 't') && a[0] == '-') {
    const std::string name = a[1] == 'r' ? "--redirects" : "--tee";
    if (a.size() == 2) return name;
    return name + "=" + (a[2] == '=' ? a.substr(3) : a.substr(2));
  }
  return std::nullopt;
}

const char* const kStdForms =
    "0 none, 1 stdout, 2 stderr, 3 both, for every local rank, or LOCAL_RANK:V,... per local rank";

StdSpec std_spec_or_usage(const std::string& opt, const std::string& v) {
  auto s = parse_std_spec(v);
  if (!s) usage(opt + ": expected " + kStdForms + " (" + opt + " 3, " + opt + " 0:1,1:2), got '" + v + "'");
  return *s;
}

// The signals lspawn forwards to the workers (run.cpp: SupervisorOptions::forward_signals).
const char* const kForwardedSignals[] = {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"};

// torchrun's flags (torchrun_compat.hpp), kept apart from the rest. `args`/`i`: the command
// line and the position of `name`'s argument, for --tee SPEC, which takes the next argument
// only when it is a std spec. Returns false when `name` is not one of them.
bool parse_torchrun_option(const std::string& name, bool has_value, const std::string& value,
                           const std::vector<std::string>& args, size_t& i,
                           const std::function<std::string(const char*)>& take, CliOptions& o) {
  auto flag = [&] {
    if (has_value) usage(name + ": takes no value (" + name + "), got '" + value + "'");
  };
  if (auto refusal = refused_torchrun_flag(name)) usage(*refusal);
  if (name == "--standalone") {
    flag();
    o.standalone = true;
  } else if (name == "--module") {
    flag();
    o.program_convention.module = true;
  } else if (name == "--no-python") {
    flag();
    o.program_convention.no_python = true;
  } else if (name == "--run-path") {
    flag();
    o.program_convention.run_path = true;
  } else if (name == "--redirects") {
    o.redirects = std_spec_or_usage(name, take("SPEC"));
  } else if (name == "--tee") {
    // torchrun's --tee SPEC, or lspawn's boolean --tee (with --log-dir: also the console) when
    // no value is attached and the next argument is not a std spec.
    if (has_value) {
      o.tee_spec = std_spec_or_usage(name, value);
    } else if (i + 1 < args.size() && parse_std_spec(args[i + 1])) {
      o.tee_spec = parse_std_spec(args[++i]);
    } else {
      o.tee = true;
    }
  } else if (name == "--local-ranks-filter") {
    const std::string v = take("RANKS");
    o.local_ranks_filter = parse_local_ranks(v);
    if (!o.local_ranks_filter) {
      usage(name + ": expected local ranks separated by commas (" + name + " 0, " + name + " 0,1), got '" + v + "'");
    }
  } else if (name == "--rdzv-conf") {
    auto kv = parse_rdzv_conf(name, take("KEY=VALUE,..."));
    o.rdzv_conf.insert(o.rdzv_conf.end(), kv.begin(), kv.end());
  } else if (name == "--local-addr") {
    o.local_addr = take("ADDR");
    if (o.local_addr.empty()) usage(name + ": empty address (" + name + " ADDR)");
  } else if (name == "--role") {
    o.role = take("NAME");
    if (o.role.empty()) usage(name + ": empty role (" + name + " NAME)");
  } else if (name == "--shutdown-timeout") {
    // torchrun's name (an integer) for lspawn's --grace-period.
    o.grace_period_s = parse_int(name, take("SECONDS"), 0, 86400, "SECONDS", "an integer number of seconds >= 0");
  } else if (name == "--log-line-prefix-template") {
    o.log_line_prefix_template = take("TEMPLATE");
  } else if (name == "--duplicate-stdout-filters" || name == "--duplicate-stderr-filters") {
    o.duplicate_filters[name == "--duplicate-stderr-filters"] = parse_filter_list(name, take("FILTER[,FILTER...]"));
  } else if (name == "--virtual-local-rank") {
    flag();
    o.virtual_local_rank = true;
  } else if (name == "--monitor-interval") {
    parse_seconds(name, take("SECONDS"));
    o.notes.push_back(name + ": ignored; lspawn learns of worker exits at once (pidfds, no polling)");
  } else if (name == "--signals-to-handle") {
    const std::string v = take("SIGNALS");
    for (const std::string& sig : split_commas(v)) {
      bool known = false;
      for (const char* f : kForwardedSignals) known = known || sig == f;
      if (!known) {
        usage(name +
              ": lspawn forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the "
              "workers, always, and no other signal; '" +
              sig + "' in '" + v + "' is not one of them (" + name + " SIGTERM,SIGUSR1, or drop the flag)");
      }
    }
    o.notes.push_back(name +
                      ": lspawn always forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the workers");
  } else {
    return false;
  }
  return true;
}

// The checks of torchrun's flags that need the whole command line.
void check_torchrun_options(CliOptions& o) {
  if (o.standalone) {
    if (!o.rdzv_endpoint.empty()) {
      usage("--standalone: cannot be combined with --rdzv-endpoint " + o.rdzv_endpoint +
            " (--standalone is one node with a local rendezvous on a free port)");
    }
    if (o.nnodes > 1) {
      usage("--standalone: cannot be combined with --nnodes " + std::to_string(o.nnodes) +
            " (--standalone is one node; for several use --rdzv-endpoint HOST:PORT)");
    }
  }
  if (o.was_given("--shutdown-timeout") && o.was_given("--grace-period")) {
    usage(
        "--shutdown-timeout: cannot be combined with --grace-period (torchrun's and lspawn's names of "
        "the same delay between SIGTERM and SIGKILL; give one)");
  }
  if (!o.log_line_prefix_template.empty() && !o.prefix) {
    usage(
        "--log-line-prefix-template: cannot be combined with --no-prefix (the template replaces "
        "lspawn's \"[rank N] \" prefix, --no-prefix drops it; give one of them)");
  }
  if (o.program_convention.no_python && o.program_convention.module) {
    usage("--no-python: cannot be combined with -m/--module (as torchrun)");
  }
  if (!o.local_addr.empty() && o.rdzv_endpoint.empty()) {
    o.notes.push_back("--local-addr " + o.local_addr +
                      ": ignored without --rdzv-endpoint (a static "
                      "job's workers meet at --master-addr)");
  }
  std::vector<std::string> ignored;
  bool join_timeout = false;  // join_timeout (the c10d backend's) wins over timeout (the static one's)
  for (const auto& [key, v] : o.rdzv_conf) {
    if (key == "last_call_timeout") {
      o.last_call_s = parse_seconds("--rdzv-conf " + key, v);
    } else if (key == "join_timeout" || key == "timeout") {
      const double s = parse_seconds("--rdzv-conf " + key, v);
      if (s < 0.1) usage("--rdzv-conf " + key + ": must be at least 0.1 s, got '" + v + "'");
      // An explicit --rdzv-timeout wins over both.
      if (!o.was_given("--rdzv-timeout") && (key == "join_timeout" || !join_timeout)) o.rdzv_timeout_s = s;
      join_timeout = join_timeout || key == "join_timeout";
    } else {
      ignored.push_back(key);
    }
  }
  if (!ignored.empty()) {
    std::string keys;
    for (const auto& k : ignored) keys += (keys.empty() ? "" : ", ") + k;
    o.notes.push_back("--rdzv-conf: ignored " + keys +
                      " (lspawn honours join_timeout and timeout, as --rdzv-timeout, and last_call_timeout)");
  }
}

}  // namespace

// What `lspawn --help` prints (usage_text()).
constexpr const char* kUsageText = R"(usage: lspawn [options] [--] program [args...]

Starts N copies of program with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...),
prefixes their output, and stops them all as soon as one fails.

options (--opt value and --opt=value are both accepted):
  --nprocs N, --nproc-per-node N  workers on this node (default 1); gpu: one per visible NVIDIA
                                  GPU, cpu: one per usable CPU, auto: gpu if any, else cpu
  --nnodes N                      number of nodes (default 1)
  --nnodes MIN:MAX                elastic (with --rdzv-endpoint): start with MIN..MAX nodes, go on
                                  with the survivors when a node is lost (a restart), admit nodes
                                  that join later (a new round, not counted as a restart)
  --node-rank R                   rank of this node, 0..N-1 (default 0)
  --master-addr ADDR              rendezvous address (default 127.0.0.1)
  --master-port PORT              rendezvous port; absent or 0: a free port, reserved for the run
                                  (--nnodes > 1: node 0's lspawn listens there for the others)
  --bind-addr ADDR                address rank 0's store listens on (default: that of
                                  --master-addr, so loopback on one node; 0.0.0.0: every interface)
  --run-id ID                     TORCHELASTIC_RUN_ID (default: random)
  Under Slurm (srun, one lspawn per node) and in a Kubernetes PyTorchJob the node count, node rank,
  master address/port and run id are detected from the environment; these flags override it
  (docs/multi-node.md). As torchrun, a flag not given takes the value of PET_<FLAG> when set
  (PET_MAX_RESTARTS=3 is --max-restarts 3; docs/cli.md).
  --grace-period SECONDS          SIGTERM -> SIGKILL delay when stopping workers (default 30, as
                                  torchrun; a worker that exits on SIGTERM ends the job at once);
  --shutdown-timeout SECONDS      torchrun's name for it (else $TORCH_ELASTIC_SHUTDOWN_TIMEOUT)
  --numa-binding MODE             torchrun's CPU placement: node, socket, exclusive or core-complex
                                  (by each local rank's GPU, or spread over the NUMA nodes without
                                  GPUs); one line says which rank got which CPUs (docs/cli.md)
  --omp-threads N                 OMP_NUM_THREADS for every worker (default, when the environment
                                  sets none: each worker's share of the CPUs, at least 1)
  --log-dir DIR                   write DIR/rank<N>.stdout and DIR/rank<N>.stderr instead of the console
                                  (restart attempt k: DIR/rank<N>.attempt<k>.std{out,err})
  --tee                           with --log-dir: also write to the console
  -r, --redirects SPEC            torchrun's: these streams to the log files only; SPEC 0 none,
                                  1 stdout, 2 stderr, 3 both, or per local rank 0:3,1:1
                                  (no --log-dir: a temporary one, named)
  -t, --tee SPEC                  torchrun's: these streams to the log files and the console
                                  (--tee not followed by a SPEC is the flag above)
  --local-ranks-filter R[,R...]   torchrun's: only these local ranks on the console; the others'
                                  output goes to the log files (no --log-dir: a temporary one, named)
  --no-prefix                     do not prefix console lines with "[rank N] " ("[HOST rank N] "
                                  when --nnodes > 1)
  --log-line-prefix-template T    torchrun's: the prefix of each console line instead, with
                                  ${rank}, ${local_rank}, ${role_name}, ${hostname}
  --duplicate-stdout-filters F[,F...], --duplicate-stderr-filters F[,F...]
                                  torchrun's: copy the lines containing an F (',,' a comma) of
                                  every rank, prefixed, to LOG_DIR/filtered_std{out,err}.log
                                  (no --log-dir: a temporary directory, named)
  --quiet                         no lspawn info lines (errors and the failure summary still printed)
  --result-file PATH              when the run ends, write its outcome there as JSON: lspawn's exit
                                  code, the root cause's local rank, each worker's pid, exit code,
                                  signal (what lspawn.spawn() in Python reads; docs/python.md)
  --no-summary                    with --result-file: no failure summary at the end (the caller
                                  reports the outcome from the file: lspawn.spawn() raises it)
  --start-method exec|forkserver  exec (default): each worker is a fresh exec of program (any
                                  program); forkserver: program is executed once and forks every
                                  worker after its static initialisation (LibTorch's loading and
                                  init happen once, not per worker); program must link lspawn's
                                  runtime (or lspawn::forkserver_hook). See docs/cli.md
  --start-method warm, --warm     as forkserver, but the forkserver comes from `lspawn daemon`,
                                  which keeps it between runs of the same unchanged program
                                  (same arguments and environment): workers start from warm
                                  memory. No daemon running: a cold forkserver (docs/warm-start.md)
  --preload MODULE[,MODULE...]    program is python3 SCRIPT [ARGS...] or python3 -m MODULE [ARGS...]:
                                  one interpreter per node imports the MODULEs (e.g. torch) and
                                  every worker is forked from it, then runs the script as __main__
                                  with the same environment, argv, output and exit code as exec.
                                  With --warm the interpreter is kept by `lspawn daemon` between
                                  runs (any script). See docs/cli.md
  --daemon-socket PATH            the daemon's socket (default $XDG_RUNTIME_DIR/lspawn/daemon.sock,
                                  else /tmp/lspawn-UID/daemon.sock)
  --no-restart-exit-codes C[,C..] a worker failure with one of these exit codes is never retried
                                  (a usage error, a bad config: K identical failures otherwise)
  --max-restarts K                on a failure, stop every node's workers and start them all
                                  again, up to K times (TORCHELASTIC_RESTART_COUNT counts; default 0)
  --rdzv-endpoint HOST[:PORT]     multi-node rendezvous at HOST:PORT (default port 29400): the
                                  lspawn that can bind it hosts it; node ranks are assigned when
                                  --node-rank is absent
  --rdzv-id ID                    same as --run-id
  --hostfile FILE                 one command for many hosts (mpirun's hostfile: NAME [slots=N],
                                  '#' comments): lspawn starts itself on every host through the
                                  remote shell, node i on the i-th host (node 0 the first, the
                                  master at its --master-port, default 29500), slots=N workers
                                  each unless --nprocs; one run id and job secret (over the remote
                                  shell's stdin); every host's output here; Ctrl-C stops them all
  --hosts A[:N],B[:N],...         the same with the hosts on the command line ([IPV6]:N)
  --rsh CMD                       the remote shell of --hostfile/--hosts (default $LSPAWN_RSH,
                                  else ssh; e.g. 'ssh -p 2222')
  --rdzv-backend c10d|static      accepted for torchrun compatibility (lspawn's own rendezvous)
  --node-timeout SECONDS          a node silent this long (lspawn dead, link down) is lost: every
                                  node stops (default 30)
  --rdzv-timeout SECONDS          every node must have joined within this time (default 600)
  --hang-timeout SECONDS          when no rank makes progress in its collectives for this long
                                  (one rank at least inside one), print a report of which ranks
                                  wait where and which are behind, with their stacks, and stop the
                                  job with exit code 124. The report on demand: kill -URG <lspawn
                                  pid>, or lspawn status <lspawn pid>. See docs/hang-diagnosis.md
  --cpu-backend lspawn|gloo       lspawn: Python workers' torch.distributed groups on gloo
                                  (init_process_group("gloo"), Lightning's and the HF Trainer's
                                  CPU default) run on lspawn's backend for CPU tensors: shared
                                  memory within a host, gloo for the rest. Needs the lspawn
                                  package in the workers' Python (docs/python-backend.md).
                                  Default gloo: the script's own choice, unchanged
  --standalone                    one node, rendezvous on a free local port (no Slurm/PyTorchJob
                                  detection); not with --rdzv-endpoint or --nnodes > 1
  -m, --module                    program is a Python module: PYTHON -u -m program [args], where
                                  PYTHON is $LSPAWN_PYTHON, else $PYTHON_EXEC, else python3. A
                                  program ending in .py runs as PYTHON -u program.py [args] (as
                                  under torchrun); any other program is exec'd as given
  --no-python                     exec program as given, even a .py one
  --run-path                      run program under PYTHON -u, whatever its name
  --rdzv-conf K=V,...             join_timeout (else timeout) is --rdzv-timeout; last_call_timeout
                                  (default 30): --nnodes MIN:MAX waits that long for more nodes
                                  once MIN have joined; others ignored
  --local-addr ADDR               with --rdzv-endpoint: the address this node advertises for its
                                  workers' store should it become node 0
  --role NAME                     the workers' ROLE_NAME (default "default")
  --virtual-local-rank            torchrun's: every worker gets LOCAL_RANK=0 and sees only its own
                                  GPU, entry LOCAL_RANK of $CUDA_VISIBLE_DEVICES (else GPU LOCAL_RANK)
  Other torchrun flags: --monitor-interval, --signals-to-handle (lspawn's signals) and
  --start-method spawn|fork are accepted with a note; --logs-specs and
  --event-log-handler are refused (docs/cli.md, "From torchrun").
  -h, --help                      this text
  --version                       print the version

exit status: 0 all workers succeeded; the failing worker's code (128+N for signal N);
128+N when lspawn received signal N; 2 usage error; 126/127 program not executable/not found;
122 the nodes did not meet (rendezvous); 123 a node was lost; 124 --hang-timeout expired;
125 lspawn internal error. See docs/exit-codes.md.

lspawn status PID                 print the status report of the running lspawn PID (same user)
lspawn daemon [--socket PATH] [--max-forkservers N] [--idle-timeout SECONDS]
                                  run the per-node warm-start daemon (foreground) for
                                  --start-method warm; lspawn daemon --status | --stop [--socket
                                  PATH] asks a running one (docs/warm-start.md)
)";

std::string usage_text() { return kUsageText; }

namespace {

using TakeValue = std::function<std::string(const char* form)>;  // the option's value, else usage()
using NoValue = std::function<void()>;                           // usage() when the option has one

// --nnodes N|MIN:MAX.
void parse_nnodes(const std::string& name, const std::string& v, CliOptions& o) {
  if (const auto colon = v.find(':'); colon != std::string::npos) {
    // torchrun's elastic MIN:MAX (docs/multi-node.md "Elastic jobs"); N:N is the count N.
    o.min_nnodes = parse_int(name, v.substr(0, colon), 1, 1 << 20, "N|MIN:MAX", "MIN:MAX with 1 <= MIN <= MAX");
    o.nnodes = parse_int(name, v.substr(colon + 1), 1, 1 << 20, "N|MIN:MAX", "MIN:MAX with 1 <= MIN <= MAX");
    if (o.min_nnodes > o.nnodes) {
      usage(name + ": MIN must not exceed MAX (" + name + " MIN:MAX, e.g. 1:4), got '" + v + "'");
    }
    if (o.min_nnodes == o.nnodes) o.min_nnodes = 0;
  } else {
    o.nnodes = parse_int(name, v, 1, 1 << 20, "N|MIN:MAX", "a positive integer or MIN:MAX");
    o.min_nnodes = 0;
  }
}

// The options that shape the job: its workers, its nodes, where they meet. Returns false when
// `name` is not one of them.
bool parse_job_option(const std::string& name, const TakeValue& take, CliOptions& o) {
  if (name == "--nprocs" || name == "--nproc-per-node") {
    const std::string v = take("N|gpu|cpu|auto");
    o.nproc_spec.clear();
    if (v == "gpu" || v == "cpu" || v == "auto") {
      o.nproc_spec = v;  // counted by run_cli (torchrun_compat.hpp)
    } else if (v == "xpu") {
      usage(name + ": 'xpu' is not supported: lspawn counts NVIDIA GPUs only (" + name + " N|gpu|cpu|auto)");
    } else {
      o.nproc_per_node = parse_int(name, v, 1, kMaxProcs, "N|gpu|cpu|auto", "a positive integer, gpu, cpu or auto");
    }
  } else if (name == "--nnodes") {
    parse_nnodes(name, take("N|MIN:MAX"), o);
  } else if (name == "--node-rank") {
    o.node_rank = parse_int(name, take("R"), 0, 1 << 20, "R", "an integer >= 0");
    o.node_rank_given = true;
  } else if (name == "--master-addr") {
    o.master_addr = take("ADDR");
    if (o.master_addr.empty()) usage(name + ": empty address (" + name + " ADDR)");
  } else if (name == "--bind-addr") {
    o.bind_addr = take("ADDR");
    if (o.bind_addr.empty()) usage(name + ": empty address (" + name + " ADDR)");
  } else if (name == "--master-port") {
    o.master_port = parse_int(name, take("PORT"), 0, 65535, "PORT", "an integer 0..65535");
  } else if (name == "--run-id" || name == "--rdzv-id") {
    o.run_id = take("ID");
    if (o.run_id.empty()) usage(name + ": empty run id (" + name + " ID)");
  } else {
    return false;
  }
  return true;
}

// --start-method exec|forkserver|warm (and torchrun's spawn|fork).
void parse_start_method(const std::string& name, const std::string& m, CliOptions& o) {
  if (m == "exec") {
    o.start_method = CliStartMethod::Exec;
  } else if (m == "forkserver") {
    o.start_method = CliStartMethod::Forkserver;
  } else if (m == "warm") {
    o.start_method = CliStartMethod::Warm;
  } else if (m == "spawn" || m == "fork") {
    // torchrun's Python multiprocessing start methods: every lspawn worker is a fresh exec.
    o.start_method = CliStartMethod::Exec;
    o.notes.push_back(name + " " + m +
                      ": torchrun's start method; lspawn starts each worker by "
                      "fork + exec (--start-method exec)");
  } else {
    usage(name + ": expected exec, forkserver or warm (" + name + " exec|forkserver|warm), got '" + m + "'");
  }
}

// The options of how this lspawn runs the workers: start method, output, timeouts, and --help,
// --version. Returns false when `name` is not one of them.
bool parse_run_option(const std::string& name, const NoValue& flag, const TakeValue& take, CliOptions& o) {
  if (name == "--help") {
    flag();
    o.help = true;
  } else if (name == "--version") {
    flag();
    o.version = true;
  } else if (name == "--no-prefix") {
    flag();
    o.prefix = false;
  } else if (name == "--quiet") {
    flag();
    o.quiet = true;
  } else if (name == "--no-summary") {
    flag();
    o.no_summary = true;
  } else if (name == "--warm") {
    flag();
    o.start_method = CliStartMethod::Warm;
  } else if (name == "--control-stdin") {
    flag();
    o.control_stdin = true;
  } else if (name == "--grace-period") {
    o.grace_period_s = parse_seconds(name, take("SECONDS"));
  } else if (name == "--numa-binding") {
    o.numa_binding = take("node|socket|exclusive|core-complex");
    if (!placement::parse_mode(o.numa_binding)) {
      usage(name + ": '" + o.numa_binding + "' is not a mode (node, socket, exclusive or core-complex, as torchrun)");
    }
  } else if (name == "--omp-threads") {
    o.omp_threads = parse_int(name, take("N"), 1, 4096, "N", "an integer number of threads >= 1");
  } else if (name == "--hang-timeout") {
    o.hang_timeout_s = parse_seconds(name, take("SECONDS"));
  } else if (name == "--cpu-backend") {
    const std::string value = take("lspawn|gloo");
    if (value != "lspawn" && value != "gloo") {
      usage(name + ": '" + value +
            "' is not a backend (lspawn: the workers' gloo groups use lspawn's shared-memory "
            "backend for CPU tensors; gloo: unchanged, the default)");
    }
    o.cpu_backend_lspawn = value == "lspawn";
  } else if (name == "--log-dir") {
    o.log_dir = take("DIR");
    if (o.log_dir.empty()) usage(name + ": empty directory (" + name + " DIR)");
  } else if (name == "--result-file") {
    o.result_file = take("PATH");
    if (o.result_file.empty()) usage(name + ": empty path (" + name + " PATH)");
  } else if (name == "--daemon-socket") {
    o.daemon_socket = take("PATH");
    if (o.daemon_socket.empty()) usage(name + ": empty path (" + name + " PATH)");
  } else if (name == "--start-method") {
    parse_start_method(name, take("exec|forkserver|warm"), o);
  } else if (name == "--preload") {
    const std::string v = take("MODULE[,MODULE...]");
    for (const std::string& m : split_commas(v)) {
      if (auto why = preload::check_module(m); !why.empty()) {
        usage(name + ": " + why + " in '" + v + "' (" + name + " MODULE[,MODULE...], e.g. torch,lightning)");
      }
      o.preload.push_back(m);
    }
  } else {
    return false;
  }
  return true;
}

// One option as written: --name or --name=value; torchrun spells some names with '_' (both are
// accepted: the name comes with '-').
struct OptionWord {
  std::string name;
  std::string value;
  bool has_value = false;
};

OptionWord split_option(const std::string& a) {
  OptionWord w{a, "", false};
  if (auto eq = a.find('='); eq != std::string::npos) {
    w.name = a.substr(0, eq);
    w.value = a.substr(eq + 1);
    w.has_value = true;
  }
  for (size_t k = 2; k < w.name.size(); ++k)
    if (w.name[k] == '_') w.name[k] = '-';
  return w;
}

// The flags of args, each checked alone, and the program (parse_cli()'s first half).
CliOptions parse_flags(const std::vector<std::string>& args) {
  CliOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string a = args[i];
    if (auto long_form = torchrun_short_option(a)) a = *long_form;
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h") {
      o.help = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the program
    if (a.compare(0, 2, "--") != 0) usage(a + ": unknown option (options are --name or --name=value)");
    const size_t option_at = i;
    const OptionWord w = split_option(a);
    const std::string& name = w.name;
    const std::string& value = w.value;
    const bool has_value = w.has_value;
    auto flag = [&]() {
      if (has_value) usage(name + ": takes no value (" + name + "), got '" + value + "'");
    };
    auto take = [&](const char* form) -> std::string {
      if (has_value) return value;
      if (i + 1 >= args.size()) usage(name + ": missing value (" + name + " " + form + ")");
      return args[++i];
    };
    if (!parse_job_option(name, take, o) && !parse_run_option(name, flag, take, o) &&
        !parse_torchrun_option(name, has_value, value, args, i, take, o) && !parse_multinode_option(name, take, o)) {
      usage(name + ": unknown option (see lspawn --help)");
    }
    o.given.insert(name == "--nproc-per-node" ? "--nprocs" : name);
    if (name == "--hostfile" || name == "--hosts" || name == "--rsh") {
      for (size_t k = option_at; k <= i; ++k) o.host_option_args.push_back(k);
    }
  }
  for (; i < args.size(); ++i) o.program.push_back(args[i]);
  return o;
}

// --hostfile/--hosts decide the nodes (fanout.hpp): what says otherwise is refused.
void check_host_options(const CliOptions& o) {
  const bool hosts = !o.hostfile.empty() || !o.hosts_list.empty();
  if (!hosts) {
    if (o.was_given("--rsh"))
      usage("--rsh: only with --hostfile FILE or --hosts A,B,... (the remote shell they start lspawn with)");
    return;
  }
  const std::string which = o.hostfile.empty() ? "--hosts" : "--hostfile";
  if (!o.hostfile.empty() && !o.hosts_list.empty()) usage("--hostfile and --hosts: give one of them");
  for (const char* decided : {"--nnodes", "--node-rank", "--master-addr", "--rdzv-endpoint", "--standalone",
                              "--control-stdin", "--local-addr"}) {
    if (o.was_given(decided)) {
      usage(std::string(decided) + ": " + which + " decides the nodes (node i is the i-th host, node 0 the first, " +
            "the master its address): leave " + decided + " out");
    }
  }
}

// What the whole command line decides (parse_cli()'s second half).
void check_options(CliOptions& o) {
  if (o.help || o.version) return;
  if (o.program.empty()) usage("missing program (lspawn [options] [--] program [args...])");
  if (o.min_nnodes > 0 && !o.standalone) {  // --standalone says its own (check_torchrun_options)
    const std::string range = std::to_string(o.min_nnodes) + ":" + std::to_string(o.nnodes);
    if (o.rdzv_endpoint.empty()) {
      usage("--nnodes " + range +
            ": an elastic range needs --rdzv-endpoint HOST:PORT (the nodes meet "
            "there; --master-addr/--master-port is a static job of a fixed node count)");
    }
    if (o.was_given("--node-rank")) {
      usage("--node-rank: an elastic job (--nnodes " + range +
            ") numbers its nodes at each rendezvous; "
            "leave --node-rank out");
    }
  }
  if (o.was_given("--node-rank") && o.was_given("--nnodes") && o.node_rank >= o.nnodes) {
    usage("--node-rank: " + std::to_string(o.node_rank) + " must be less than --nnodes " + std::to_string(o.nnodes) +
          " (--node-rank R with 0 <= R < N)");
  }
  check_host_options(o);
  if (o.tee && o.log_dir.empty() && !o.redirects && !o.tee_spec) {
    usage("--tee: needs --log-dir DIR (--log-dir DIR --tee), or a stream spec (--tee 3)");
  }
  if (o.no_summary && o.result_file.empty()) {
    usage("--no-summary: needs --result-file PATH (the outcome must go somewhere: --result-file PATH --no-summary)");
  }
  check_torchrun_options(o);
  if (!o.preload.empty()) {
    if (o.start_method == CliStartMethod::Exec && o.was_given("--start-method")) {
      usage("--preload: forks its workers from one interpreter; it cannot be --start-method exec");
    }
    if (o.start_method == CliStartMethod::Exec) o.start_method = CliStartMethod::Forkserver;
    if (o.program_convention.no_python) usage("--preload: runs a Python program; it cannot be --no-python");
    o.program_convention.unbuffered = false;  // no interpreter option per worker
    // The program is checked once torchrun's conventions made it a Python command line
    // (check_preload_program(), called by the CLI): `--preload torch train.py` and `-m` work too.
  }
}

}  // namespace

CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o = parse_flags(args);
  check_options(o);
  return o;
}

CliOptions parse_cli(const std::vector<std::string>& args, const EnvLookup& env) {
  CliOptions o = parse_flags(args);
  if (o.help || o.version) return o;
  const EnvFlags from_env = torchrun_env_flags(env, o.given);
  o.notes.insert(o.notes.end(), from_env.notes.begin(), from_env.notes.end());
  if (from_env.flags.empty()) {
    check_options(o);
    return o;
  }
  // Each variable alone first, so that a bad value is named by its variable, not by a flag the
  // command line does not have.
  std::vector<std::string> all;
  std::string used;
  for (const EnvFlag& f : from_env.flags) {
    std::vector<std::string> alone = f.args;
    alone.push_back("program");
    try {
      parse_cli(alone);
    } catch (const UsageError& e) {
      throw UsageError(f.var + "='" + f.value + "' (torchrun's environment default of " + f.flag + "): " + e.what());
    }
    all.insert(all.end(), f.args.begin(), f.args.end());
    used += (used.empty() ? "" : ", ") + f.var + "=" + f.value;
  }
  all.insert(all.end(), args.begin(), args.end());  // after: the command line wins
  try {
    o = parse_flags(all);
    const size_t from_env_args = all.size() - args.size();
    for (size_t& k : o.host_option_args) k -= from_env_args;  // indices into `args`
    check_options(o);
  } catch (const UsageError& e) {
    throw UsageError(std::string(e.what()) + " (with " + used + " from the environment)");
  }
  o.notes.insert(o.notes.begin(), "from the environment (torchrun's PET_* defaults): " + used);
  o.notes.insert(o.notes.end(), from_env.notes.begin(), from_env.notes.end());
  return o;
}

}  // namespace lspawn
