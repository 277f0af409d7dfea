#include "launchenv/launch_env.hpp"

#include <climits>
#include <cstdlib>
#include <vector>

#include "launchenv/slurm_hostlist.hpp"
#include "launchenv/slurm_tasks_per_node.hpp"

namespace lspawn {
namespace {

// A whole decimal integer in [lo, hi], or EnvSyntaxError naming the variable.
long long env_int(const std::string& name, const std::string& v, long long lo, long long hi) {
  if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
    throw EnvSyntaxError(name, v, "expected an integer " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  const long long n = std::strtoll(v.c_str(), nullptr, 10);
  if (n < lo || n > hi) {
    throw EnvSyntaxError(name, v, "out of range " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return n;
}

// The first of `names` that is set: its name and value.
std::optional<std::pair<std::string, std::string>> first_set(const EnvLookup& env,
                                                             std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = env(n)) return std::make_pair(std::string(n), *v);
  }
  return std::nullopt;
}

[[noreturn]] void usage(const std::string& msg) { throw UsageError(msg); }

// What one detector found; fields unset are left to the flags/defaults.
struct Detected {
  Scheduler scheduler = Scheduler::None;
  std::string what;  // "Slurm job 42", "Kubernetes PyTorchJob"
  std::optional<int> nproc_per_node, nnodes, min_nnodes, node_rank, master_port;
  std::optional<std::string> nproc_spec;  // gpu|cpu|auto
  std::optional<std::string> master_addr, run_id;
  std::string nnodes_var = "--nnodes", node_rank_var = "--node-rank";  // for messages
};

std::optional<Detected> detect_slurm(const EnvLookup& env) {
  const auto job = env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : env("SLURM_JOBID");
  if (!job || !env("SLURM_STEP_ID")) return std::nullopt;
  Detected d;
  d.scheduler = Scheduler::Slurm;
  const long long job_id = env_int(env("SLURM_JOB_ID") ? "SLURM_JOB_ID" : "SLURM_JOBID", *job, 0, LLONG_MAX / 2);
  d.what = "Slurm job " + *job;
  d.run_id = *job;

  const auto nn = first_set(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  if (!nn) usage("Slurm job " + *job + ": none of SLURM_STEP_NUM_NODES, SLURM_NNODES, SLURM_JOB_NUM_NODES is set");
  d.nnodes = static_cast<int>(env_int(nn->first, nn->second, 1, 1 << 20));
  d.nnodes_var = nn->first;
  const auto nodeid = env("SLURM_NODEID");
  if (!nodeid) usage("Slurm job " + *job + ": SLURM_NODEID is not set (lspawn must be started by srun)");
  d.node_rank = static_cast<int>(env_int("SLURM_NODEID", *nodeid, 0, 1 << 20));
  d.node_rank_var = "SLURM_NODEID";

  // One lspawn per node: the step's tasks per node must all be 1.
  if (const auto tpn = first_set(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    const std::vector<int> counts = slurm::expand_tasks_per_node(tpn->second, tpn->first);
    if (static_cast<int>(counts.size()) != *d.nnodes) {
      throw EnvSyntaxError(tpn->first, tpn->second,
                           "describes " + std::to_string(counts.size()) + " nodes but " + nn->first + "=" + nn->second);
    }
    for (int c : counts) {
      if (c != 1) {
        usage("Slurm job " + *job + ": " + tpn->first + "=" + tpn->second +
              ": lspawn must run once per node (it starts the workers itself); use srun -N" + nn->second + " -n" +
              nn->second +
              " --ntasks-per-node=1 lspawn ..., or run the "
              "program without lspawn: srun --ntasks-per-node=K prog");
      }
    }
  }

  if (const auto a = env("MASTER_ADDR"); a && !a->empty()) {
    d.master_addr = *a;
  } else if (const auto nl = first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    const std::vector<std::string> hosts = slurm::expand_hostlist(nl->second, nl->first);
    if (static_cast<int>(hosts.size()) != *d.nnodes) {
      throw EnvSyntaxError(nl->first, nl->second,
                           "names " + std::to_string(hosts.size()) + " hosts but " + nn->first + "=" + nn->second);
    }
    d.master_addr = hosts.front();
  } else {
    usage("Slurm job " + *job +
          ": no SLURM_STEP_NODELIST/SLURM_JOB_NODELIST to find the master node in (or export MASTER_ADDR)");
  }
  if (const auto p = env("MASTER_PORT"); p && !p->empty()) {
    d.master_port = static_cast<int>(env_int("MASTER_PORT", *p, 1, 65535));
  } else {
    d.master_port = slurm_default_port(job_id);
  }
  if (const auto g = env("SLURM_GPUS_ON_NODE"); g && !g->empty()) {
    const int gpus = static_cast<int>(env_int("SLURM_GPUS_ON_NODE", *g, 0, 4096));
    if (gpus > 0) d.nproc_per_node = gpus;
  }
  return d;
}

std::optional<Detected> detect_pytorchjob(const EnvLookup& env, const LaunchFlags& f) {
  const auto pet_nnodes = env("PET_NNODES");
  const auto pet_rank = env("PET_NODE_RANK");
  Detected d;
  d.scheduler = Scheduler::PyTorchJob;
  d.what = "Kubernetes PyTorchJob";
  // An elasticPolicy gives a rendezvous endpoint (PET_RDZV_ENDPOINT, read as --rdzv-endpoint by
  // the CLI): the rendezvous numbers the nodes, as torchrun's c10d rendezvous does.
  const bool rdzv = !f.rdzv_endpoint.empty();
  if (pet_nnodes || pet_rank) {
    if (!pet_nnodes) usage("Kubernetes PyTorchJob: PET_NNODES is missing next to PET_NODE_RANK");
    d.nnodes_var = "PET_NNODES";
    if (const auto colon = pet_nnodes->find(':'); colon != std::string::npos) {
      if (!rdzv) {
        throw EnvSyntaxError("PET_NNODES", *pet_nnodes,
                             "an elastic range (MIN:MAX) needs a rendezvous endpoint: PET_RDZV_ENDPOINT "
                             "(an elasticPolicy sets it) or --rdzv-endpoint HOST:PORT");
      }
      long long lo = 0, hi = 0;
      try {
        lo = env_int("PET_NNODES", pet_nnodes->substr(0, colon), 1, 1 << 20);
        hi = env_int("PET_NNODES", pet_nnodes->substr(colon + 1), 1, 1 << 20);
      } catch (const EnvSyntaxError&) {
        throw EnvSyntaxError("PET_NNODES", *pet_nnodes, "expected N or MIN:MAX, integers 1..1048576");
      }
      if (lo > hi) throw EnvSyntaxError("PET_NNODES", *pet_nnodes, "MIN must not exceed MAX");
      d.nnodes = static_cast<int>(hi);
      d.min_nnodes = lo == hi ? 0 : static_cast<int>(lo);
      // PET_NODE_RANK, set too when the job has a Master replica, is not read: the rendezvous
      // numbers an elastic job's nodes.
    } else {
      d.nnodes = static_cast<int>(env_int("PET_NNODES", *pet_nnodes, 1, 1 << 20));
      if (!pet_rank && !rdzv) usage("Kubernetes PyTorchJob: PET_NODE_RANK is missing next to PET_NNODES");
      if (pet_rank) {
        d.node_rank = static_cast<int>(env_int("PET_NODE_RANK", *pet_rank, 0, 1 << 20));
        d.node_rank_var = "PET_NODE_RANK";
      }
    }
    if (const auto n = env("PET_NPROC_PER_NODE")) {
      if (*n == "gpu" || *n == "cpu" || *n == "auto") {
        d.nproc_spec = *n;  // torchrun's forms; the CLI counts
      } else {
        try {
          d.nproc_per_node = static_cast<int>(env_int("PET_NPROC_PER_NODE", *n, 1, 4096));
        } catch (const EnvSyntaxError&) {
          throw EnvSyntaxError("PET_NPROC_PER_NODE", *n, "expected an integer 1..4096, gpu, cpu or auto");
        }
      }
    }
  } else {
    // Operators before v1.7: WORLD_SIZE = pods, RANK = pod index (no LOCAL_RANK: not a worker).
    const auto ws = env("WORLD_SIZE");
    const auto rank = env("RANK");
    if (!ws || !rank || !env("MASTER_ADDR") || !env("MASTER_PORT") || env("LOCAL_RANK")) {
      return std::nullopt;
    }
    d.nnodes = static_cast<int>(env_int("WORLD_SIZE", *ws, 1, 1 << 20));
    d.nnodes_var = "WORLD_SIZE";
    d.node_rank = static_cast<int>(env_int("RANK", *rank, 0, 1 << 20));
    d.node_rank_var = "RANK";
  }
  const auto addr = first_set(env, {"PET_MASTER_ADDR", "MASTER_ADDR"});
  const auto port = first_set(env, {"PET_MASTER_PORT", "MASTER_PORT"});
  if (addr) {
    if (addr->second.empty()) throw EnvSyntaxError(addr->first, addr->second, "empty address");
    d.master_addr = addr->second;
  }
  if (port) d.master_port = static_cast<int>(env_int(port->first, port->second, 1, 65535));
  if (const auto id = env("PET_RDZV_ID"); id && !id->empty()) {
    d.run_id = *id;
  } else if (addr && port) {
    // Every pod sees the same master service and port: a run id they agree on.
    d.run_id = "pytorchjob-" + addr->second + "-" + port->second;
  } else if (rdzv) {
    d.run_id = "pytorchjob-" + f.rdzv_endpoint;  // the same for every pod too
  }
  return d;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

int slurm_default_port(long long job_id) { return 15000 + static_cast<int>(job_id % 10000); }

LaunchSettings resolve_launch(const LaunchFlags& f, const EnvLookup& env) {
  // --standalone: one node whatever the cluster manager says (torchrun's --standalone).
  std::optional<Detected> d = f.standalone ? std::nullopt : detect_slurm(env);
  if (!d && !f.standalone) d = detect_pytorchjob(env, f);

  LaunchSettings s;
  auto pick = [&](const char* flag, auto flag_value, const auto& detected, auto fallback) {
    if (f.was_given(flag)) return flag_value;
    if (detected) return *detected;
    return fallback;
  };
  const Detected none;
  const Detected& det = d ? *d : none;
  s.nproc_per_node = pick("--nprocs", f.nproc_per_node, det.nproc_per_node, f.nproc_per_node);
  if (f.was_given("--nprocs") || !det.nproc_spec) {
    s.nproc_spec = f.nproc_spec;
    s.nproc_var = "--nproc-per-node";
  } else {
    s.nproc_spec = *det.nproc_spec;
    s.nproc_var = "PET_NPROC_PER_NODE";
  }
  s.nnodes = pick("--nnodes", f.nnodes, det.nnodes, f.nnodes);
  s.min_nnodes = f.was_given("--nnodes") || !det.nnodes ? f.min_nnodes : det.min_nnodes.value_or(0);
  s.node_rank = pick("--node-rank", f.node_rank, det.node_rank, f.node_rank);
  s.master_addr = pick("--master-addr", f.master_addr, det.master_addr, f.master_addr);
  s.master_port = pick("--master-port", f.master_port, det.master_port, f.master_port);
  s.run_id = pick("--run-id", f.run_id, det.run_id, f.run_id);
  s.scheduler = det.scheduler;

  const std::string nn_name = f.was_given("--nnodes") ? "--nnodes" : det.nnodes ? det.nnodes_var : "--nnodes";
  const std::string nr_name = f.was_given("--node-rank") ? "--node-rank"
                              : det.node_rank            ? det.node_rank_var
                                                         : "--node-rank";
  if (s.node_rank >= s.nnodes) {
    usage(nr_name + ": " + std::to_string(s.node_rank) + " must be less than " + nn_name + " " +
          std::to_string(s.nnodes) + " (--node-rank R with 0 <= R < N)");
  }
  s.node_rank_given = f.was_given("--node-rank") || det.node_rank.has_value();
  if (s.min_nnodes > 0 && f.was_given("--node-rank")) {
    usage("--node-rank: an elastic job (" + nn_name + " " + std::to_string(s.min_nnodes) + ":" +
          std::to_string(s.nnodes) + ") numbers its nodes at each rendezvous; leave --node-rank out");
  }
  if (s.nnodes > 1 && f.rdzv_endpoint.empty() && s.master_port == 0) {
    usage(
        "--master-port: required when --nnodes > 1 without --rdzv-endpoint (every node must agree "
        "on it: --master-port PORT)");
  }
  if (s.nnodes > 1 && f.rdzv_endpoint.empty() && !s.node_rank_given) {
    usage(
        "--node-rank: required when --nnodes > 1 with --master-addr/--master-port (static "
        "rendezvous); use --rdzv-endpoint HOST:PORT to have node ranks assigned");
  }
  if (!d) {
    // lspawn in a Slurm batch script but not under srun: one node only; say how to use them all.
    const auto job = env("SLURM_JOB_ID");
    const auto nodes = first_set(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
    if (job && nodes && nodes->second != "1" && !f.was_given("--nnodes") && !f.standalone) {
      s.detected = "Slurm job " + *job + " has " + nodes->second +
                   " nodes but this lspawn is not a task "
                   "of a job step (no SLURM_STEP_ID): running on this node only; start one lspawn per "
                   "node with srun --ntasks-per-node=1 (docs/multi-node.md)";
    }
  } else {
    const std::string workers = !s.nproc_spec.empty() ? "workers per node: " + s.nproc_spec + " (" + s.nproc_var + ")"
                                                      : std::to_string(s.nproc_per_node) + " worker" +
                                                            (s.nproc_per_node == 1 ? "" : "s") + " per node";
    if (s.node_rank_given || f.rdzv_endpoint.empty()) {
      s.detected = d->what + ": node " + std::to_string(s.node_rank) + " of " + std::to_string(s.nnodes) + ", master " +
                   s.master_addr + ":" + std::to_string(s.master_port) + ", " + workers;
    } else {
      s.detected =
          d->what + ": " + (s.min_nnodes > 0 ? "elastic, " + std::to_string(s.min_nnodes) + " to " : std::string()) +
          std::to_string(s.nnodes) + " nodes, node rank from the rendezvous at " + f.rdzv_endpoint + ", " + workers;
    }
  }
  return s;
}

}  // namespace lspawn
