// WorkerEnv: what a worker learns about its place in the job from its environment.
//
// The variable names are torchrun's (docs/env-contract.md), so a worker built on lspawn runs
// unchanged under `lspawn` and under `torchrun --no-python`, and a PyTorch script using
// init_method="env://" runs unchanged under `lspawn`.
//
// Parsing is strict: a value that is present but malformed is an error (EnvError naming the
// variable, its value and the expected form), never silently replaced by a default. Defaults
// apply only to variables that are absent, and only where torchrun has one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "proto/error.hpp"

namespace lspawn {

// A variable of the env contract is missing or malformed. what() names the variable, the value
// seen and the expected form, e.g. "RANK='x' is not an integer".
class EnvError : public lspawn::Error {
 public:
  explicit EnvError(const std::string& message) : lspawn::Error(message) {}
};

struct WorkerEnv {
  int rank = 0;                  // RANK (required): global rank, 0 <= rank < world_size
  int local_rank = 0;            // LOCAL_RANK, default RANK: rank among the workers of this node
  int world_size = 1;            // WORLD_SIZE (required): number of workers in the job, >= 1
  int local_world_size = 1;      // LOCAL_WORLD_SIZE, default WORLD_SIZE: workers on this node
  int group_rank = 0;            // GROUP_RANK, default 0: rank of this node
  int group_world_size = 1;      // GROUP_WORLD_SIZE, default 1: number of nodes
  int role_rank = 0;             // ROLE_RANK, default RANK
  int role_world_size = 1;       // ROLE_WORLD_SIZE, default WORLD_SIZE
  std::string master_addr;       // MASTER_ADDR: store host; default 127.0.0.1 on a single node
                                 // (GROUP_WORLD_SIZE=1), required with several nodes
  uint16_t master_port = 0;      // MASTER_PORT (required): store port, 1..65535 (0 only for a
                                 // one-worker job: the store then picks a free port)
  std::string run_id;            // TORCHELASTIC_RUN_ID, default "none" (torchrun's default)
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT, default 0
  int max_restarts = 0;          // TORCHELASTIC_MAX_RESTARTS, default 0
  std::string error_file;        // TORCHELASTIC_ERROR_FILE, else LSPAWN_ERROR_FILE, else "" (none)
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE == "True": the store at
                                 // MASTER_ADDR:MASTER_PORT is hosted by the launcher (torchrun's
                                 // static rendezvous), so rank 0 connects as a client too
  std::string job_secret;        // LSPAWN_JOB_SECRET, "" when unset (torchrun): the records and gloo
                                 // tokens are authenticated with its round key (RecordAuth::for_round
                                 // with run_id and restart_count; record_auth.hpp). Never printed.
  std::string bind_addr;         // LSPAWN_BIND_ADDR, "" when unset: where rank 0's store listens
                                 // (runtime/store_listener.hpp; default MASTER_ADDR's address)

  // Reads the process environment. Throws EnvError on a missing required or malformed variable.
  // Workers started without lspawn/torchrun (RANK unset) read their cluster manager's names
  // instead; a torchrun name that is set (e.g. MASTER_ADDR exported) still wins over a derived one:
  // - Open MPI's mpirun (OMPI_COMM_WORLD_RANK set; preferred over SLURM_*, which under mpirun in
  //   a Slurm job describe orted, not the ranks): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
  //   from OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; GROUP_WORLD_SIZE from
  //   OMPI_MCA_orte_num_nodes and GROUP_RANK = RANK / LOCAL_SIZE when the slots are even;
  //   MASTER_PORT = 15000 + OMPI_MCA_ess_base_jobid % 10000, TORCHELASTIC_RUN_ID "ompi-<jobid>";
  //   MASTER_ADDR required (mpirun -x) when the ranks span nodes, else 127.0.0.1.
  // - A task of a Slurm job step (SLURM_STEP_ID set; `srun prog`): RANK =
  //   SLURM_PROCID, WORLD_SIZE = SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), LOCAL_RANK =
  //   SLURM_LOCALID, LOCAL_WORLD_SIZE = this node's entry of SLURM_STEP_TASKS_PER_NODE (else
  //   SLURM_TASKS_PER_NODE), GROUP_RANK = SLURM_NODEID, GROUP_WORLD_SIZE = SLURM_STEP_NUM_NODES
  //   (else SLURM_NNODES), MASTER_ADDR = first host of SLURM_STEP_NODELIST (else
  //   SLURM_JOB_NODELIST), MASTER_PORT = 15000 + SLURM_JOB_ID % 10000 (slurm_default_port),
  //   TORCHELASTIC_RUN_ID = SLURM_JOB_ID. A Slurm batch script (SLURM_PROCID without
  //   SLURM_STEP_ID) is not a task: EnvError saying so.
  static WorkerEnv from_environment();

  // Same rules, reading `vars` instead of the environment (tests, spawn hand-offs).
  static WorkerEnv from_map(const std::map<std::string, std::string>& vars);

  // Same rules over any lookup: returns the value of a variable, or nullopt when it is unset.
  static WorkerEnv from_lookup(const std::function<std::optional<std::string>(const std::string&)>& lookup);

  // "rank 2/4 (local 0/2, node 1/2)": for messages.
  std::string describe() const;
};

// Reads a duration given in seconds (integer or decimal, e.g. "300", "2.5") from the environment
// variable `name`. Returns nullopt when unset or empty; throws EnvError when malformed or < 0.
std::optional<std::chrono::milliseconds> duration_from_environment(const char* name);

}  // namespace lspawn
