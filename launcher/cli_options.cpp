#include "launcher/cli_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace lspawn {
namespace {

constexpr int kMaxProcs = 4096;

[[noreturn]] void usage(const std::string& msg) { throw UsageError(msg); }

// form: the placeholder ("N"); what: what it must be ("a positive integer").
int parse_int(const std::string& opt, const std::string& v, int lo, int hi, const char* form,
              const char* what) {
  const std::string accepted = " (" + opt + " " + form + ")";
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 9) {
    usage(opt + ": expected " + what + accepted + ", got '" + v + "'");
  }
  const long n = std::strtol(v.c_str(), nullptr, 10);
  if (n < lo || n > hi) {
    usage(opt + ": " + v + " is out of range " + std::to_string(lo) + ".." + std::to_string(hi) +
          accepted);
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

}  // namespace

std::string usage_text() {
  return R"(usage: lspawn [options] [--] program [args...]

Starts N copies of program with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...),
prefixes their output, and stops them all as soon as one fails.

options (--opt value and --opt=value are both accepted):
  --nprocs N, --nproc-per-node N  workers on this node (default 1)
  --nnodes N                      number of nodes (default 1)
  --node-rank R                   rank of this node, 0..N-1 (default 0)
  --master-addr ADDR              rendezvous address (default 127.0.0.1)
  --master-port PORT              rendezvous port; absent or 0: a free port, reserved for the run
  --bind-addr ADDR                address rank 0's store listens on (default: that of
                                  --master-addr, so loopback on one node; 0.0.0.0: every interface)
  --run-id ID                     TORCHELASTIC_RUN_ID (default: random)
  --grace-period SECONDS          SIGTERM -> SIGKILL delay when stopping workers (default 5)
  --log-dir DIR                   write DIR/rank<N>.stdout and DIR/rank<N>.stderr instead of the console
  --tee                           with --log-dir: also write to the console
  --no-prefix                     do not prefix console lines with "[rank N] "
  --quiet                         no lspawn info lines (errors and the failure summary still printed)
  --start-method exec|forkserver  exec (default): each worker is a fresh exec of program (any
                                  program); forkserver: program is executed once and forks every
                                  worker after its static initialisation (LibTorch's loading and
                                  init happen once, not per worker); program must link lspawn's
                                  runtime (or lspawn::forkserver_hook). See docs/cli.md
  --max-restarts 0                accepted for torchrun compatibility; only 0 is supported
  -h, --help                      this text
  --version                       print the version

exit status: 0 all workers succeeded; the failing worker's code (128+N for signal N);
128+N when lspawn received signal N; 2 usage error; 126/127 program not executable/not found;
125 lspawn internal error. See docs/exit-codes.md.
)";
}

CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o;
  bool port_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
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
    std::string name = a;
    std::string value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    // torchrun spells some options with '_': accept both.
    for (size_t k = 2; k < name.size(); ++k)
      if (name[k] == '_') name[k] = '-';

    auto flag = [&]() {
      if (has_value) usage(name + ": takes no value (" + name + "), got '" + value + "'");
    };
    auto take = [&](const char* form) -> std::string {
      if (has_value) return value;
      if (i + 1 >= args.size()) usage(name + ": missing value (" + name + " " + form + ")");
      return args[++i];
    };

    if (name == "--help") {
      flag();
      o.help = true;
    } else if (name == "--version") {
      flag();
      o.version = true;
    } else if (name == "--nprocs" || name == "--nproc-per-node") {
      o.nproc_per_node = parse_int(name, take("N"), 1, kMaxProcs, "N", "a positive integer");
    } else if (name == "--nnodes") {
      o.nnodes = parse_int(name, take("N"), 1, 1 << 20, "N", "a positive integer");
    } else if (name == "--node-rank") {
      o.node_rank = parse_int(name, take("R"), 0, 1 << 20, "R", "an integer >= 0");
    } else if (name == "--master-addr") {
      o.master_addr = take("ADDR");
      if (o.master_addr.empty()) usage(name + ": empty address (" + name + " ADDR)");
    } else if (name == "--bind-addr") {
      o.bind_addr = take("ADDR");
      if (o.bind_addr.empty()) usage(name + ": empty address (" + name + " ADDR)");
    } else if (name == "--master-port") {
      o.master_port = parse_int(name, take("PORT"), 0, 65535, "PORT", "an integer 0..65535");
      port_given = o.master_port != 0;
    } else if (name == "--run-id") {
      o.run_id = take("ID");
      if (o.run_id.empty()) usage(name + ": empty run id (" + name + " ID)");
    } else if (name == "--grace-period") {
      o.grace_period_s = parse_seconds(name, take("SECONDS"));
    } else if (name == "--log-dir") {
      o.log_dir = take("DIR");
      if (o.log_dir.empty()) usage(name + ": empty directory (" + name + " DIR)");
    } else if (name == "--tee") {
      flag();
      o.tee = true;
    } else if (name == "--no-prefix") {
      flag();
      o.prefix = false;
    } else if (name == "--quiet") {
      flag();
      o.quiet = true;
    } else if (name == "--start-method") {
      const std::string m = take("exec|forkserver");
      if (m == "exec") {
        o.start_method = CliStartMethod::Exec;
      } else if (m == "forkserver") {
        o.start_method = CliStartMethod::Forkserver;
      } else {
        usage(name + ": expected exec or forkserver (" + name + " exec|forkserver), got '" + m + "'");
      }
    } else if (name == "--max-restarts") {
      o.max_restarts = parse_int(name, take("0"), 0, 1 << 20, "0", "0");
      if (o.max_restarts != 0) {
        usage(name + ": only 0 is supported (restarts are not implemented), got " +
              std::to_string(o.max_restarts));
      }
    } else {
      usage(name + ": unknown option (see lspawn --help)");
    }
  }
  for (; i < args.size(); ++i) o.program.push_back(args[i]);
  if (o.help || o.version) return o;
  if (o.program.empty()) usage("missing program (lspawn [options] [--] program [args...])");
  if (o.node_rank >= o.nnodes) {
    usage("--node-rank: " + std::to_string(o.node_rank) + " must be less than --nnodes " +
          std::to_string(o.nnodes) + " (--node-rank R with 0 <= R < N)");
  }
  if (o.nnodes > 1 && !port_given) {
    usage("--master-port: required when --nnodes > 1 (every node must agree on it: --master-port PORT)");
  }
  if (o.tee && o.log_dir.empty()) usage("--tee: needs --log-dir DIR (--log-dir DIR --tee)");
  return o;
}

}  // namespace lspawn
