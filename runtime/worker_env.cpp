#include "runtime/worker_env.hpp"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "launchenv/launch_env.hpp"
#include "launchenv/slurm_hostlist.hpp"
#include "launchenv/slurm_tasks_per_node.hpp"

namespace lspawn {
namespace {

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

std::string quoted(const std::string& name, const std::string& value) { return name + "='" + value + "'"; }

// Parses a whole decimal integer in [lo, hi]; throws EnvError naming the variable otherwise.
long parse_integer(const std::string& name, const std::string& value, long lo, long hi) {
  if (value.empty()) throw EnvError(name + " is set but empty: expected an integer");
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0') {
    throw EnvError(quoted(name, value) + " is not an integer");
  }
  if (errno == ERANGE || v < lo || v > hi) {
    throw EnvError(quoted(name, value) + " is out of range: expected " + std::to_string(lo) + ".." +
                   std::to_string(hi));
  }
  return v;
}

class Reader {
 public:
  explicit Reader(const Lookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> get(const std::string& name) const { return lookup_(name); }

  std::optional<int> integer(const std::string& name, long lo, long hi = INT_MAX) const {
    auto v = lookup_(name);
    if (!v) return std::nullopt;
    return static_cast<int>(parse_integer(name, *v, lo, hi));
  }

  int required_integer(const std::string& name, long lo, long hi = INT_MAX) const {
    auto v = integer(name, lo, hi);
    if (!v) throw EnvError(name + " missing: set it or run under lspawn/torchrun");
    return *v;
  }

 private:
  const Lookup& lookup_;
};

// "LOCAL_RANK=5 is not below LOCAL_WORLD_SIZE=4"
void check_below(const char* a_name, int a, const char* b_name, int b) {
  if (a >= b) {
    throw EnvError(std::string(a_name) + "=" + std::to_string(a) + " is not below " + b_name + "=" + std::to_string(b));
  }
}

}  // namespace

namespace {

// A lookup that answers `derived` first, then the real environment.
Lookup overlay(const Lookup& lookup, std::map<std::string, std::string> derived) {
  return [lookup, derived = std::move(derived)](const std::string& name) -> std::optional<std::string> {
    if (auto v = lookup(name)) return v;  // what the user exported always wins
    auto it = derived.find(name);
    if (it == derived.end()) return std::nullopt;
    return it->second;
  };
}

std::optional<std::pair<std::string, std::string>> first_set(const Lookup& lookup,
                                                             std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = lookup(n)) return std::make_pair(std::string(n), *v);
  }
  return std::nullopt;
}

// Under `mpirun` (Open MPI) the torchrun names are absent and Open MPI's own say where a process
// is. MASTER_ADDR/MASTER_PORT may come from `mpirun -x`; absent, the port is derived from the
// job id every rank shares (OMPI_MCA_ess_base_jobid) and the address is 127.0.0.1 when every
// rank is on this node (required otherwise).
Lookup open_mpi(const Lookup& lookup) {
  std::map<std::string, std::string> d = {
      {"RANK", *lookup("OMPI_COMM_WORLD_RANK")},
  };
  auto copy = [&](const char* to, const char* from) {
    if (auto v = lookup(from)) d[to] = *v;
  };
  copy("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE");
  copy("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
  copy("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE");
  const long rank = parse_integer("OMPI_COMM_WORLD_RANK", d["RANK"], 0, INT_MAX);
  const auto size = lookup("OMPI_COMM_WORLD_SIZE");
  const auto local_size = lookup("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (size && local_size) {
    const long n = parse_integer("OMPI_COMM_WORLD_SIZE", *size, 1, INT_MAX);
    const long l = parse_integer("OMPI_COMM_WORLD_LOCAL_SIZE", *local_size, 1, INT_MAX);
    // Node index and count: exact for mpirun's default by-slot mapping with equal slots per node.
    if (auto nodes = lookup("OMPI_MCA_orte_num_nodes")) {
      const long nn = parse_integer("OMPI_MCA_orte_num_nodes", *nodes, 1, INT_MAX);
      if (nn * l == n) {
        d["GROUP_WORLD_SIZE"] = std::to_string(nn);
        d["GROUP_RANK"] = std::to_string(rank / l);
      }
    }
    if (l < n && !lookup("MASTER_ADDR")) {
      throw EnvError(
          "MASTER_ADDR missing: the ranks of this mpirun span several nodes "
          "(OMPI_COMM_WORLD_LOCAL_SIZE=" +
          *local_size + " < OMPI_COMM_WORLD_SIZE=" + *size +
          "); pass the host of rank 0: mpirun -x MASTER_ADDR=<host> ...");
    }
  }
  if (auto job = lookup("OMPI_MCA_ess_base_jobid")) {
    const long long id = parse_integer("OMPI_MCA_ess_base_jobid", *job, 0, LONG_MAX);
    d["MASTER_PORT"] = std::to_string(15000 + id % 10000);
    d["TORCHELASTIC_RUN_ID"] = "ompi-" + *job;
  }
  return overlay(lookup, std::move(d));
}

// A task of a Slurm job step started directly by srun (`srun --ntasks-per-node=K prog`, no
// lspawn): SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID say where it is.
Lookup slurm_task(const Lookup& lookup) {
  std::map<std::string, std::string> d;
  auto need = [&](const char* name) {
    auto v = lookup(name);
    if (!v) throw EnvError(std::string(name) + " missing in a Slurm job step (SLURM_STEP_ID is set)");
    return *v;
  };
  const auto job = first_set(lookup, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) throw EnvError("SLURM_JOB_ID missing in a Slurm job step (SLURM_STEP_ID is set)");
  d["RANK"] = need("SLURM_PROCID");
  const auto ntasks = first_set(lookup, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  if (!ntasks) throw EnvError("SLURM_NTASKS missing in a Slurm job step (SLURM_STEP_ID is set)");
  d["WORLD_SIZE"] = ntasks->second;
  d["LOCAL_RANK"] = need("SLURM_LOCALID");
  const std::string nodeid = need("SLURM_NODEID");
  d["GROUP_RANK"] = nodeid;
  const auto nnodes = first_set(lookup, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  if (!nnodes) throw EnvError("SLURM_NNODES missing in a Slurm job step (SLURM_STEP_ID is set)");
  d["GROUP_WORLD_SIZE"] = nnodes->second;
  const long node = parse_integer("SLURM_NODEID", nodeid, 0, INT_MAX);
  const long nodes = parse_integer(nnodes->first, nnodes->second, 1, INT_MAX);
  if (const auto tpn = first_set(lookup, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    const std::vector<int> counts = slurm::expand_tasks_per_node(tpn->second, tpn->first);
    if (static_cast<long>(counts.size()) != nodes) {
      throw EnvError(tpn->first + "='" + tpn->second + "' describes " + std::to_string(counts.size()) + " nodes but " +
                     nnodes->first + "=" + nnodes->second);
    }
    if (node >= nodes) {
      throw EnvError("SLURM_NODEID=" + nodeid + " is not below " + nnodes->first + "=" + nnodes->second);
    }
    d["LOCAL_WORLD_SIZE"] = std::to_string(counts[static_cast<size_t>(node)]);
  }
  if (const auto nl = first_set(lookup, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    d["MASTER_ADDR"] = slurm::first_host(nl->second, nl->first);
  }
  d["MASTER_PORT"] = std::to_string(slurm_default_port(parse_integer(job->first, job->second, 0, LONG_MAX)));
  d["TORCHELASTIC_RUN_ID"] = job->second;
  return overlay(lookup, std::move(d));
}

// Which names to read: torchrun's when RANK is set (lspawn, torchrun); else Open MPI's (mpirun,
// also inside a Slurm job, where orted's SLURM_* describe the daemons, not the ranks); else
// Slurm's for a task of a job step. The batch script itself (SLURM_PROCID but no SLURM_STEP_ID)
// is not one of the job's tasks.
Lookup with_cluster_fallback(const Lookup& lookup) {
  if (lookup("RANK")) return lookup;
  if (lookup("OMPI_COMM_WORLD_RANK")) return open_mpi(lookup);
  if (lookup("SLURM_STEP_ID")) return slurm_task(lookup);
  if (lookup("SLURM_PROCID")) {
    throw EnvError(
        "RANK missing: SLURM_PROCID is set but SLURM_STEP_ID is not, so this is a Slurm "
        "batch script, not one of the job's tasks; start the program with srun "
        "(srun --ntasks-per-node=K prog) or lspawn");
  }
  return lookup;
}

}  // namespace

WorkerEnv WorkerEnv::from_lookup(const Lookup& plain_lookup) {
  Lookup lookup;
  try {
    lookup = with_cluster_fallback(plain_lookup);  // Reader keeps a reference
  } catch (const EnvSyntaxError& e) {
    throw EnvError(e.what());
  }
  const Reader r(lookup);
  WorkerEnv e;
  e.world_size = r.required_integer("WORLD_SIZE", 1);
  e.rank = r.required_integer("RANK", 0);
  check_below("RANK", e.rank, "WORLD_SIZE", e.world_size);

  e.local_world_size = r.integer("LOCAL_WORLD_SIZE", 1).value_or(e.world_size);
  if (e.local_world_size > e.world_size) {
    throw EnvError("LOCAL_WORLD_SIZE=" + std::to_string(e.local_world_size) +
                   " is larger than WORLD_SIZE=" + std::to_string(e.world_size));
  }
  // Without LOCAL_WORLD_SIZE every worker is local, so LOCAL_RANK defaults to RANK.
  e.local_rank = r.integer("LOCAL_RANK", 0).value_or(e.rank);
  check_below("LOCAL_RANK", e.local_rank, "LOCAL_WORLD_SIZE", e.local_world_size);

  e.group_world_size = r.integer("GROUP_WORLD_SIZE", 1).value_or(1);
  e.group_rank = r.integer("GROUP_RANK", 0).value_or(0);
  check_below("GROUP_RANK", e.group_rank, "GROUP_WORLD_SIZE", e.group_world_size);

  e.role_world_size = r.integer("ROLE_WORLD_SIZE", 1).value_or(e.world_size);
  e.role_rank = r.integer("ROLE_RANK", 0).value_or(e.rank);
  check_below("ROLE_RANK", e.role_rank, "ROLE_WORLD_SIZE", e.role_world_size);

  if (auto addr = r.get("MASTER_ADDR")) {
    if (addr->empty()) throw EnvError("MASTER_ADDR is set but empty: expected a host name or address");
    e.master_addr = *addr;
  } else if (e.group_world_size == 1) {
    e.master_addr = "127.0.0.1";
  } else {
    throw EnvError("MASTER_ADDR missing (required with GROUP_WORLD_SIZE=" + std::to_string(e.group_world_size) +
                   " nodes): set it or run under lspawn/torchrun");
  }

  e.master_port = static_cast<uint16_t>(r.required_integer("MASTER_PORT", 0, 65535));
  if (e.master_port == 0 && e.world_size > 1) {
    throw EnvError("MASTER_PORT=0 is only valid for WORLD_SIZE=1 (got WORLD_SIZE=" + std::to_string(e.world_size) +
                   "): other ranks could not find the store");
  }

  e.run_id = r.get("TORCHELASTIC_RUN_ID").value_or("none");
  if (e.run_id.empty()) e.run_id = "none";
  e.restart_count = r.integer("TORCHELASTIC_RESTART_COUNT", 0).value_or(0);
  e.max_restarts = r.integer("TORCHELASTIC_MAX_RESTARTS", 0).value_or(0);

  if (auto f = r.get("TORCHELASTIC_ERROR_FILE"); f && !f->empty()) {
    e.error_file = *f;
  } else if (auto g = r.get("LSPAWN_ERROR_FILE"); g && !g->empty()) {
    e.error_file = *g;
  }

  if (auto s = r.get("LSPAWN_JOB_SECRET"); s && !s->empty()) {
    if (s->size() < 16) {
      // The value itself is never put in a message.
      throw EnvError("LSPAWN_JOB_SECRET is too short (" + std::to_string(s->size()) +
                     " characters, at least 16 needed)");
    }
    e.job_secret = *s;
  }
  if (auto b = r.get("LSPAWN_BIND_ADDR"); b && !b->empty()) e.bind_addr = *b;

  if (auto s = r.get("TORCHELASTIC_USE_AGENT_STORE")) {
    if (*s == "True" || *s == "1" || *s == "true") {
      e.use_agent_store = true;
    } else if (*s == "False" || *s == "0" || *s == "false" || s->empty()) {
      e.use_agent_store = false;
    } else {
      throw EnvError(quoted("TORCHELASTIC_USE_AGENT_STORE", *s) + " is not a boolean: expected True or False");
    }
  }
  return e;
}

WorkerEnv WorkerEnv::from_map(const std::map<std::string, std::string>& vars) {
  return from_lookup([&vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

WorkerEnv WorkerEnv::from_environment() {
  return from_lookup([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

std::string WorkerEnv::describe() const {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " + std::to_string(local_rank) +
         "/" + std::to_string(local_world_size) + ", node " + std::to_string(group_rank) + "/" +
         std::to_string(group_world_size) + ")";
}

std::optional<std::chrono::milliseconds> duration_from_environment(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double seconds = std::strtod(v, &end);
  if (end == v || *end != '\0' || errno == ERANGE || !std::isfinite(seconds)) {
    throw EnvError(quoted(name, v) + " is not a number of seconds (e.g. 300 or 2.5)");
  }
  if (seconds < 0 || seconds > 1e9) {
    throw EnvError(quoted(name, v) + " is out of range: expected 0..1e9 seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

}  // namespace lspawn
