#include "runtime/worker_env.hpp"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace lspawn {
namespace {

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

std::string quoted(const std::string& name, const std::string& value) {
  return name + "='" + value + "'";
}

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
    throw EnvError(quoted(name, value) + " is out of range: expected " + std::to_string(lo) +
                   ".." + std::to_string(hi));
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
    throw EnvError(std::string(a_name) + "=" + std::to_string(a) + " is not below " + b_name +
                   "=" + std::to_string(b));
  }
}

}  // namespace

namespace {

// Under `mpirun` (Open MPI) the torchrun names are absent and Open MPI's own say where a process
// is. They are read only when RANK is unset, so a worker under lspawn/torchrun (which set RANK)
// never mixes the two. MASTER_ADDR/MASTER_PORT still come from the environment (`mpirun -x`).
Lookup with_open_mpi_fallback(const Lookup& lookup) {
  if (lookup("RANK") || !lookup("OMPI_COMM_WORLD_RANK")) return lookup;
  return [lookup](const std::string& name) -> std::optional<std::string> {
    static const std::map<std::string, std::string> kOpenMpi = {
        {"RANK", "OMPI_COMM_WORLD_RANK"},
        {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"},
        {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    };
    if (auto v = lookup(name)) return v;
    auto it = kOpenMpi.find(name);
    return it == kOpenMpi.end() ? std::nullopt : lookup(it->second);
  };
}

}  // namespace

WorkerEnv WorkerEnv::from_lookup(const Lookup& plain_lookup) {
  const Lookup lookup = with_open_mpi_fallback(plain_lookup);  // Reader keeps a reference
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
    throw EnvError("MASTER_ADDR missing (required with GROUP_WORLD_SIZE=" +
                   std::to_string(e.group_world_size) + " nodes): set it or run under lspawn/torchrun");
  }

  e.master_port = static_cast<uint16_t>(r.required_integer("MASTER_PORT", 0, 65535));
  if (e.master_port == 0 && e.world_size > 1) {
    throw EnvError("MASTER_PORT=0 is only valid for WORLD_SIZE=1 (got WORLD_SIZE=" +
                   std::to_string(e.world_size) + "): other ranks could not find the store");
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
  return "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + "/" + std::to_string(local_world_size) + ", node " +
         std::to_string(group_rank) + "/" + std::to_string(group_world_size) + ")";
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
