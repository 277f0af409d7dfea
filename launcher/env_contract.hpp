// The environment contract between a launcher and each worker (DESIGN.md §2): torchrun's
// variable names, so unmodified PyTorch scripts (init_method="env://") run under lspawn and
// lspawn workers run under torchrun. This file is the one place the names are spelled.
//
// Used by the CLI (launcher/cli_main) and by lspawn::spawn(); the worker side reads the same
// names (runtime/).
#pragma once

#include <string>
#include <vector>

namespace lspawn::env {

inline constexpr const char* kRank = "RANK";
inline constexpr const char* kLocalRank = "LOCAL_RANK";
inline constexpr const char* kWorldSize = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kGroupRank = "GROUP_RANK";
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";
inline constexpr const char* kRoleRank = "ROLE_RANK";
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";
inline constexpr const char* kRoleName = "ROLE_NAME";
inline constexpr const char* kMasterAddr = "MASTER_ADDR";
inline constexpr const char* kMasterPort = "MASTER_PORT";
inline constexpr const char* kRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr const char* kErrorFile = "TORCHELASTIC_ERROR_FILE";
inline constexpr const char* kUseAgentStore = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kOmpNumThreads = "OMP_NUM_THREADS";
// lspawn's own additions.
inline constexpr const char* kLspawnErrorFile = "LSPAWN_ERROR_FILE";  // same as kErrorFile
inline constexpr const char* kLspawnRunDir = "LSPAWN_RUN_DIR";        // private dir of the run
inline constexpr const char* kLspawnVersion = "LSPAWN_VERSION";

// Where one worker sits in the job. Invariants: 0 <= local_rank < nproc_per_node,
// 0 <= node_rank < nnodes.
struct WorkerPlace {
  int local_rank = 0;
  int nproc_per_node = 1;
  int node_rank = 0;
  int nnodes = 1;

  int rank() const { return node_rank * nproc_per_node + local_rank; }
  int world_size() const { return nnodes * nproc_per_node; }
};

// What is common to every worker of a run.
struct JobEnv {
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          // the real port (never 0 once a run starts)
  std::string run_id;           // TORCHELASTIC_RUN_ID
  std::string run_dir;          // LSPAWN_RUN_DIR; error files live here
  std::string role_name = "default";
  int restart_count = 0;
  int max_restarts = 0;
  // Set OMP_NUM_THREADS=1 when nproc_per_node > 1 and the base env has no OMP_NUM_THREADS.
  bool default_omp_threads = true;
};

// Path of the error file of `rank` inside run_dir: run_dir + "/error-<rank>.json".
std::string error_file_path(const std::string& run_dir, int rank);

// True when the base environment (`environ` when base is empty) needs the OMP_NUM_THREADS
// default, i.e. nproc_per_node > 1 and OMP_NUM_THREADS is not set. The CLI prints one info
// line when this is true.
bool needs_omp_default(const std::vector<std::string>& base, int nproc_per_node);

// The full environment ("NAME=value" strings) of one worker: `base` (the caller's environment
// when empty — pass {} to inherit `environ`) with every contract variable set or replaced.
std::vector<std::string> worker_environment(const JobEnv& job, const WorkerPlace& place,
                                            const std::vector<std::string>& base = {});

// The current process environment as "NAME=value" strings.
std::vector<std::string> current_environment();

}  // namespace lspawn::env
