// LaunchSettings: where this lspawn sits in a multi-node job, from its flags and from the
// cluster manager that started it (docs/multi-node.md, docs/env-contract.md).
//
// resolve_launch() is a pure function of (flags, environment): it reads variables through a
// lookup, touches no file or socket, and is tested with tables of the environments Slurm 22.05
// and Kubeflow's training-operator really set. Explicit flags always win over what is detected.
//
// Detected, in this order (the first that applies):
// - Slurm, when lspawn is a task of a job step (SLURM_JOB_ID and SLURM_STEP_ID set: `srun
//   --ntasks-per-node=1 lspawn ...` inside sbatch/salloc). The batch script itself (no step id)
//   is not one of the job's nodes' tasks and is not detected.
//     node rank     SLURM_NODEID (never gethostname(): several slurmd of one machine share it)
//     node count    SLURM_STEP_NUM_NODES, else SLURM_NNODES, else SLURM_JOB_NUM_NODES
//     master addr   MASTER_ADDR if exported, else the first host of SLURM_STEP_NODELIST (else
//                   SLURM_JOB_NODELIST, SLURM_NODELIST), as the name given (not resolved here)
//     master port   MASTER_PORT if exported, else slurm_default_port(SLURM_JOB_ID)
//     run id        SLURM_JOB_ID
//     nprocs        SLURM_GPUS_ON_NODE when > 0, else 1 (srun replaces the job's
//                   SLURM_NTASKS_PER_NODE in the step: pass --nprocs $SLURM_NTASKS_PER_NODE from
//                   the batch script for one worker per task of the job)
//   The step must have exactly one task per node (SLURM_STEP_TASKS_PER_NODE all 1), else
//   UsageError: several lspawn per node would start the job several times.
// - Kubernetes PyTorchJob (training-operator), when PET_NNODES or PET_NODE_RANK is set (v1.7+):
//     node count PET_NNODES, node rank PET_NODE_RANK, nprocs PET_NPROC_PER_NODE (a count, or
//     torchrun's gpu|cpu|auto, which Kubeflow Trainer's TrainJob sets by default: nproc_spec),
//     master PET_MASTER_ADDR/PET_MASTER_PORT, else MASTER_ADDR/MASTER_PORT; run id
//     PET_RDZV_ID, else the master address and port.
//   With a rendezvous endpoint (an elasticPolicy's PET_RDZV_ENDPOINT, which the CLI reads as
//   --rdzv-endpoint, or the flag): PET_NNODES may be elastic, MIN:MAX (min_nnodes, nnodes), and
//   the node rank comes from the rendezvous (PET_NODE_RANK is not needed; with MIN:MAX it is not
//   read); the run id is PET_RDZV_ID, else the master's, else pytorchjob-<endpoint>. Without
//   one, MIN:MAX is an EnvSyntaxError naming PET_NNODES.
//   Older operators (no PET_*) set WORLD_SIZE = number of pods and RANK = pod index next to
//   MASTER_ADDR/MASTER_PORT: all four set and no LOCAL_RANK → node count and node rank.
// - Otherwise, and always with --standalone: the flags and their defaults (one node).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <set>

#include "launchenv/env_syntax_error.hpp"
#include "sys/exit_codes.hpp"

namespace lspawn {

// What the command line says about where the job runs: the flags resolve_launch() reads. The
// CLI's options (launcher/cli_options.hpp) extend it.
struct LaunchFlags {
  int nproc_per_node = 1;                 // --nprocs / --nproc-per-node, >= 1
  std::string nproc_spec;                 // --nproc-per-node gpu|cpu|auto (counted by the CLI); empty:
                                          // nproc_per_node is the count
  int nnodes = 1;                         // --nnodes, >= 1 (with MIN:MAX: MAX)
  int min_nnodes = 0;                     // --nnodes MIN:MAX: MIN; 0: a fixed count
  int node_rank = 0;                      // --node-rank, 0 <= node_rank < nnodes
  std::string master_addr = "127.0.0.1";  // --master-addr
  int master_port = 0;                    // --master-port; 0: a free port is reserved
  std::string run_id;                     // --run-id / --rdzv-id; empty: random (drawn by node 0)
  std::string rdzv_endpoint;              // --rdzv-endpoint HOST[:PORT]; empty: static (master addr/port)
  bool standalone = false;                // --standalone: one node, rendezvous on a free local port,
                                          // cluster detection (Slurm, PyTorchJob) off
  // Options given on the command line, by their canonical name ("--nprocs" for both spellings,
  // "--node-rank", ...): what the user said explicitly wins over what is detected.
  std::set<std::string> given;
  bool was_given(const std::string& option) const { return given.count(option) != 0; }
};

// Returns the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The process environment (getenv).
EnvLookup process_environment();

enum class Scheduler { None, Slurm, PyTorchJob };

struct LaunchSettings {
  int nproc_per_node = 1;        // when nproc_spec is empty
  std::string nproc_spec;        // gpu|cpu|auto, for the CLI to count (torchrun's forms)
  std::string nproc_var;         // where nproc_spec came from: --nproc-per-node, PET_NPROC_PER_NODE
  int nnodes = 1;                // an elastic job's MAX
  int min_nnodes = 0;            // an elastic job's MIN (a rendezvous endpoint is set); 0: fixed
  int node_rank = 0;             // 0 <= node_rank < nnodes
  bool node_rank_given = false;  // by --node-rank or the scheduler (else: assigned by rendezvous)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 only with nnodes == 1: a free port is reserved
  std::string run_id;   // empty: the CLI draws a random one (single node)
  Scheduler scheduler = Scheduler::None;
  // One line for the user, e.g. "Slurm job 42: node 1 of 2, master n01:29500, 2 workers per
  // node"; or a hint when lspawn runs in a multi-node Slurm batch script without srun; empty
  // otherwise.
  std::string detected;
};

// The rendezvous port lspawn (and lspawn's runtime, for `srun prog` without lspawn) uses in
// Slurm job `job_id` when MASTER_PORT is not exported: 15000 + job_id % 10000 (the port
// PyTorch Lightning derives too), so every node of a job agrees on it without talking.
int slurm_default_port(long long job_id);

// Merges flags and environment. Throws UsageError for a combination that cannot run (a step
// with several tasks per node, --nnodes > 1 without a port, node rank out of range) and
// EnvSyntaxError for a malformed variable (it names the variable and its value).
LaunchSettings resolve_launch(const LaunchFlags& flags, const EnvLookup& env);

}  // namespace lspawn
