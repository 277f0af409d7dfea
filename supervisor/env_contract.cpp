#include "supervisor/env_contract.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

#include "supervisor/version.hpp"

extern char** environ;

namespace lspawn::env {

std::string error_file_path(const std::string& run_dir, int rank) {
  return run_dir + "/error-" + std::to_string(rank) + ".json";
}

std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

namespace {
std::optional<std::string> value_of(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& kv : env) {
    if (kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 && kv[name.size()] == '=')
      return kv.substr(name.size() + 1);
  }
  return std::nullopt;
}
bool has_var(const std::vector<std::string>& env, const std::string& name) { return value_of(env, name).has_value(); }
}  // namespace

VirtualDevice virtual_visible_device(const std::vector<std::string>& base, int local_rank) {
  const char* var = kHipVisibleDevices;
  auto list = value_of(base, var);
  const bool hip = list && !list->empty();
  if (!hip) {
    var = kCudaVisibleDevices;
    list = value_of(base, var);
  }
  if (!list) return {std::to_string(local_rank), false};
  std::vector<std::string> devices;
  size_t pos = 0;
  while (!list->empty()) {
    const size_t comma = list->find(',', pos);
    std::string d = list->substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    d.erase(0, d.find_first_not_of(" \t"));
    d.erase(d.find_last_not_of(" \t") + 1);
    devices.push_back(d);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (local_rank < 0 || local_rank >= static_cast<int>(devices.size()) || devices[local_rank].empty()) {
    throw std::invalid_argument("local rank " + std::to_string(local_rank) + " has no device in " + var + "='" + *list +
                                "' (" + std::to_string(devices.size()) + " entr" + (devices.size() == 1 ? "y" : "ies") +
                                ")");
  }
  return {devices[local_rank], hip};
}

OmpDefault omp_threads_default(const std::vector<std::string>& base_in, int nproc_per_node, int usable_cpus) {
  const std::vector<std::string> base = base_in.empty() ? current_environment() : base_in;
  if (has_var(base, kOmpNumThreads)) return {};
  int cpus = std::max(usable_cpus, 1);
  std::string why = std::to_string(cpus) + " CPU" + (cpus == 1 ? "" : "s") + " lspawn may use";
  const auto slurm_cpus = value_of(base, "SLURM_CPUS_PER_TASK");
  const bool slurm = slurm_cpus && has_var(base, "SLURM_JOB_ID");
  if (slurm) {
    const std::string& v = *slurm_cpus;
    int n = 0;
    const bool digits =
        !v.empty() && v.size() <= 6 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) n = std::stoi(v);
    if (n < 1) {
      throw std::invalid_argument("SLURM_CPUS_PER_TASK='" + v + "': not a count of CPUs (an integer >= 1), " +
                                  "so OMP_NUM_THREADS has no default; set OMP_NUM_THREADS or --omp-threads");
    }
    if (n < cpus) {
      cpus = n;
      why = "SLURM_CPUS_PER_TASK=" + v;
    }
  } else if (nproc_per_node <= 1) {
    return {};
  }
  return {std::max(1, cpus / std::max(nproc_per_node, 1)), why};
}

std::vector<std::string> without_run_variables(const std::vector<std::string>& env) {
  static const char* const kPerRun[] = {
      kRank,        kLocalRank,     kWorldSize,       kLocalWorldSize, kGroupRank,       kGroupWorldSize,
      kRoleRank,    kRoleWorldSize, kMasterAddr,      kMasterPort,     kRunId,           kRestartCount,
      kMaxRestarts, kErrorFile,     kLspawnErrorFile, kLspawnRunDir,   kLspawnJobSecret, kLspawnBindAddr};
  std::vector<std::string> out;
  for (const auto& kv : env) {
    const std::string name = kv.substr(0, kv.find('='));
    bool per_run = false;
    for (const char* n : kPerRun) per_run = per_run || name == n;
    if (!per_run) out.push_back(kv);
  }
  return out;
}

namespace {
// Read by gloo where it has the batched connect (LibTorch 2.15; not 2.4.1's or 1.13's), not by
// torch's Python: set for the workers unless the environment has it (docs/env-contract.md).
constexpr const char* kGlooStoreV2Api = "GLOO_ENABLE_STORE_V2_API";
}  // namespace

std::vector<std::string> worker_environment(const JobEnv& job, const WorkerPlace& place,
                                            const std::vector<std::string>& base_in) {
  const std::vector<std::string> base = base_in.empty() ? current_environment() : base_in;
  std::map<std::string, std::string> set;
  auto put = [&](const char* k, std::string v) { set[k] = std::move(v); };
  put(kRank, std::to_string(place.rank()));
  if (job.virtual_local_rank) {
    put(kLocalRank, "0");
    const VirtualDevice d = virtual_visible_device(base, place.local_rank);
    put(kCudaVisibleDevices, d.device);
    if (d.hip) put(kHipVisibleDevices, d.device);
  } else {
    put(kLocalRank, std::to_string(place.local_rank));
  }
  put(kWorldSize, std::to_string(place.world_size()));
  put(kLocalWorldSize, std::to_string(place.nproc_per_node));
  put(kGroupRank, std::to_string(place.node_rank));
  put(kGroupWorldSize, std::to_string(place.nnodes));
  put(kRoleRank, std::to_string(place.rank()));
  put(kRoleWorldSize, std::to_string(place.world_size()));
  put(kRoleName, job.role_name);
  put(kMasterAddr, job.master_addr);
  put(kMasterPort, std::to_string(job.master_port));
  put(kRunId, job.run_id);
  put(kRestartCount, std::to_string(job.restart_count));
  put(kMaxRestarts, std::to_string(job.max_restarts));
  put(kUseAgentStore, "False");
  put(kLspawnVersion, kVersion);
  if (!job.run_dir.empty()) {
    const std::string ef = error_file_path(job.run_dir, place.rank());
    put(kErrorFile, ef);
    put(kLspawnErrorFile, ef);
    put(kLspawnRunDir, job.run_dir);
  }
  if (!job.job_secret.empty()) put(kLspawnJobSecret, job.job_secret);
  if (!job.bind_addr.empty()) put(kLspawnBindAddr, job.bind_addr);
  if (job.omp_threads > 0) put(kOmpNumThreads, std::to_string(job.omp_threads));
  if (!has_var(base, kNcclAsyncErrorHandling) && !has_var(base, kNcclAsyncErrorHandlingOld)) {
    put(kNcclAsyncErrorHandling, "1");
  }
  // gloo's full-mesh connect reads its peers' addresses 128 at a time (one multiGet) instead of
  // one by one, where the store has c10d's extended API (TCPStore, and lspawn's own store
  // wrappers: runtime/store_extended_api.hpp). The gloo of LibTorch 2.15 reads it (2.4.1's and
  // 1.13's do not); torchrun does not set it. docs/scale-gloo-mesh.md: 4,097 -> 1,057 store requests per rank at 1,024 ranks.
  if (!has_var(base, kGlooStoreV2Api)) put(kGlooStoreV2Api, "1");

  std::vector<std::string> out;
  out.reserve(base.size() + set.size());
  for (const auto& kv : base) {
    const auto eq = kv.find('=');
    const std::string name = kv.substr(0, eq);
    if (set.count(name)) continue;           // replaced below
    if (name == kLspawnJobSecret) continue;  // only the job's own secret, never an inherited one
    out.push_back(kv);
  }
  for (auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

}  // namespace lspawn::env
