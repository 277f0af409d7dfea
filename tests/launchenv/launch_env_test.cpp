#include <catch2/catch.hpp>

#include "launchenv/launch_env.hpp"
#include "launcher/cli_options.hpp"  // parse_cli: the flags as a user writes them
#include "support/cluster_env.hpp"

using lspawn::CliOptions;
using lspawn::EnvSyntaxError;
using lspawn::LaunchSettings;
using lspawn::parse_cli;
using lspawn::resolve_launch;
using lspawn::Scheduler;
using lspawn::UsageError;
using lspawn::test::cluster_env;
using lspawn::test::EnvMap;
using lspawn::test::lookup_of;

namespace {
// As the CLI does: the flags with torchrun's PET_* defaults (parse_cli(args, env)), then detection.
LaunchSettings resolve(const std::vector<std::string>& args, const EnvMap& env) {
  std::vector<std::string> a = args;
  a.push_back("prog");
  return resolve_launch(parse_cli(a, lookup_of(env)), lookup_of(env));
}
std::string error_of(const std::vector<std::string>& args, const EnvMap& env) {
  try {
    resolve(args, env);
  } catch (const UsageError& e) {
    return e.what();
  } catch (const EnvSyntaxError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("resolve_launch: no cluster manager, flags and defaults only", "[launch-env]") {
  LaunchSettings s = resolve({}, {{"PATH", "/bin"}});
  CHECK(s.scheduler == Scheduler::None);
  CHECK(s.nnodes == 1);
  CHECK(s.node_rank == 0);
  CHECK(s.master_addr == "127.0.0.1");
  CHECK(s.master_port == 0);
  CHECK(s.run_id.empty());
  CHECK(s.detected.empty());
  s = resolve({"--nnodes", "2", "--node-rank", "1", "--master-addr", "h", "--master-port", "7", "--nprocs", "3"}, {});
  CHECK(s.nnodes == 2);
  CHECK(s.node_rank == 1);
  CHECK(s.master_addr == "h");
  CHECK(s.master_port == 7);
  CHECK(s.nproc_per_node == 3);
  CHECK(error_of({"--nnodes", "2"}, {}).find("--master-port: required when --nnodes > 1") == 0);
  // Static multi-node needs this node's rank (from the flag or the scheduler); --rdzv-endpoint assigns one.
  CHECK(error_of({"--nnodes", "2", "--master-port", "5"}, {}).find("--node-rank: required when --nnodes > 1") == 0);
  CHECK(resolve({"--nnodes", "2", "--rdzv-endpoint", "h:5"}, {}).node_rank_given == false);
  CHECK(resolve({"--nnodes", "2", "--node-rank", "1", "--master-port", "5"}, {}).node_rank_given);
  CHECK(error_of({"--node-rank", "1"}, {}).find("--node-rank: 1 must be less than --nnodes 1") == 0);
  // A shell with MASTER_ADDR/MASTER_PORT exported but no scheduler: not a PyTorchJob.
  CHECK(resolve({}, {{"MASTER_ADDR", "x"}, {"MASTER_PORT", "5"}}).scheduler == Scheduler::None);
}

TEST_CASE("resolve_launch: srun --ntasks-per-node=1 lspawn inside sbatch (captured env)", "[launch-env][slurm]") {
  // Real environment of the two tasks of `srun -N2 -n2 --ntasks-per-node=1` in job 5 on n[1-2].
  for (int task : {0, 1}) {
    INFO("task " << task);
    const EnvMap env = cluster_env("slurm-sbatch-srun-one-per-node.env", task);
    const LaunchSettings s = resolve({}, env);
    CHECK(s.scheduler == Scheduler::Slurm);
    CHECK(s.nnodes == 2);
    CHECK(s.node_rank == task);     // SLURM_NODEID, not the host name (both "vm")
    CHECK(s.master_addr == "n1");   // first host of n[1-2], as named
    CHECK(s.master_port == 15005);  // 15000 + job id 5
    CHECK(s.run_id == "5");
    CHECK(s.nproc_per_node == 1);
    CHECK(s.detected == "Slurm job 5: node " + std::to_string(task) + " of 2, master n1:15005, 1 worker per node");
    // Explicit flags win, one by one.
    const LaunchSettings f =
        resolve({"--nprocs", "2", "--master-port", "29500", "--master-addr", "10.0.0.9", "--run-id", "mine"}, env);
    CHECK(f.nproc_per_node == 2);
    CHECK(f.master_port == 29500);
    CHECK(f.master_addr == "10.0.0.9");
    CHECK(f.run_id == "mine");
    CHECK(f.node_rank == task);
    CHECK(f.detected ==
          "Slurm job 5: node " + std::to_string(task) + " of 2, master 10.0.0.9:29500, 2 workers per node");
  }
}

TEST_CASE("resolve_launch: Slurm variations", "[launch-env][slurm]") {
  EnvMap env = cluster_env("slurm-sbatch-srun-one-per-node.env", 1);
  SECTION("MASTER_ADDR / MASTER_PORT exported in the batch script win over the nodelist and job id") {
    env["MASTER_ADDR"] = "head";
    env["MASTER_PORT"] = "23456";
    const LaunchSettings s = resolve({}, env);
    CHECK(s.master_addr == "head");
    CHECK(s.master_port == 23456);
  }
  SECTION("full hostlist syntax: the first host keeps its padding") {
    env["SLURM_STEP_NODELIST"] = "gpu-a[07-08],n[01-04]";
    env["SLURM_STEP_NUM_NODES"] = "6";
    env["SLURM_STEP_TASKS_PER_NODE"] = "1(x6)";
    env["SLURM_NODEID"] = "5";
    const LaunchSettings s = resolve({}, env);
    CHECK(s.master_addr == "gpu-a07");
    CHECK(s.nnodes == 6);
    CHECK(s.node_rank == 5);
  }
  SECTION("SLURM_GPUS_ON_NODE gives the default number of workers") {
    env["SLURM_GPUS_ON_NODE"] = "4";
    CHECK(resolve({}, env).nproc_per_node == 4);
    CHECK(resolve({"--nprocs", "1"}, env).nproc_per_node == 1);
    env["SLURM_GPUS_ON_NODE"] = "0";
    CHECK(resolve({}, env).nproc_per_node == 1);
  }
  SECTION("several tasks per node: refused, it would start the job twice per node") {
    const EnvMap two = cluster_env("slurm-srun-N2-n4-loopback.env", 2);
    CHECK_THAT(error_of({}, two),
               Catch::StartsWith("Slurm job 3: SLURM_STEP_TASKS_PER_NODE=2(x2): lspawn must run once per node"));
  }
  SECTION("malformed variables are named") {
    env["SLURM_STEP_NODELIST"] = "n[1-2";
    CHECK(error_of({}, env) == "SLURM_STEP_NODELIST='n[1-2': '[' at offset 1 is never closed");
    env["SLURM_STEP_NODELIST"] = "n[1-3]";
    CHECK(error_of({}, env) == "SLURM_STEP_NODELIST='n[1-3]': names 3 hosts but SLURM_STEP_NUM_NODES=2");
    env["SLURM_STEP_NODELIST"] = "n[1-2]";
    env["SLURM_NODEID"] = "x";
    CHECK(error_of({}, env) == "SLURM_NODEID='x': expected an integer 0..1048576");
    env["SLURM_NODEID"] = "2";
    CHECK(error_of({}, env).find("SLURM_NODEID: 2 must be less than SLURM_STEP_NUM_NODES 2") == 0);
    env["SLURM_NODEID"] = "1";
    env["SLURM_STEP_TASKS_PER_NODE"] = "1(x3)";
    CHECK(error_of({}, env) == "SLURM_STEP_TASKS_PER_NODE='1(x3)': describes 3 nodes but SLURM_STEP_NUM_NODES=2");
  }
  SECTION("the batch script itself (no step id) is not a task of the job: not detected") {
    const LaunchSettings s = resolve({}, cluster_env("slurm-sbatch-script-N2-tpn2.env"));
    CHECK(s.scheduler == Scheduler::None);
    CHECK(s.nnodes == 1);
    CHECK(s.detected.find("Slurm job 5 has 2 nodes but this lspawn is not a task of a job step") == 0);
  }
}

TEST_CASE("resolve_launch: Kubernetes PyTorchJob", "[launch-env][k8s]") {
  // What training-operator v1.7+ sets in the pods of a job with 2 replicas, nprocPerNode 2
  // (pkg/controller.v1/pytorch/envvar.go; /work/shared/cluster/pytorchjob-emu.sh).
  for (int pod : {0, 1}) {
    INFO("pod " << pod);
    const EnvMap env = {{"MASTER_ADDR", "job-master-0"},
                        {"MASTER_PORT", "23456"},
                        {"WORLD_SIZE", "4"},
                        {"RANK", std::to_string(pod)},
                        {"PET_NPROC_PER_NODE", "2"},
                        {"PET_NODE_RANK", std::to_string(pod)},
                        {"PET_NNODES", "2"},
                        {"PYTHONUNBUFFERED", "0"}};
    const LaunchSettings s = resolve({}, env);
    CHECK(s.scheduler == Scheduler::PyTorchJob);
    CHECK(s.nnodes == 2);
    CHECK(s.node_rank == pod);
    CHECK(s.nproc_per_node == 2);
    CHECK(s.master_addr == "job-master-0");
    CHECK(s.master_port == 23456);
    CHECK(s.run_id == "pytorchjob-job-master-0-23456");
    CHECK(s.detected == "Kubernetes PyTorchJob: node " + std::to_string(pod) +
                            " of 2, master job-master-0:23456, 2 workers per node");
    CHECK(resolve({"--nprocs", "1", "--run-id", "r"}, env).nproc_per_node == 1);
  }
  SECTION("older operators: WORLD_SIZE = pods, RANK = pod index") {
    const LaunchSettings s =
        resolve({}, {{"MASTER_ADDR", "m"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"}, {"RANK", "2"}});
    CHECK(s.scheduler == Scheduler::PyTorchJob);
    CHECK(s.nnodes == 3);
    CHECK(s.node_rank == 2);
    // a worker's environment (LOCAL_RANK set) is not a pod's
    CHECK(resolve({},
                  {{"MASTER_ADDR", "m"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "3"}, {"RANK", "2"}, {"LOCAL_RANK", "0"}})
              .scheduler == Scheduler::None);
  }
  SECTION("PET_NPROC_PER_NODE gpu|cpu|auto (Kubeflow Trainer's default is auto): counted by the CLI; the flag wins") {
    for (const char* spec : {"gpu", "cpu", "auto"}) {
      const LaunchSettings s = resolve({}, {{"PET_NNODES", "2"},
                                            {"PET_NODE_RANK", "1"},
                                            {"PET_NPROC_PER_NODE", spec},
                                            {"PET_MASTER_ADDR", "m"},
                                            {"PET_MASTER_PORT", "9"}});
      CHECK(s.nproc_spec == spec);
      CHECK(s.nproc_var == "PET_NPROC_PER_NODE");
      CHECK(s.detected == std::string("Kubernetes PyTorchJob: node 1 of 2, master m:9, workers per node: ") + spec +
                              " (PET_NPROC_PER_NODE)");
    }
    const EnvMap env = {
        {"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "auto"}, {"MASTER_PORT", "9"}};
    const LaunchSettings n = resolve({"--nprocs", "3"}, env);
    CHECK(n.nproc_spec.empty());
    CHECK(n.nproc_per_node == 3);
    const LaunchSettings c = resolve({"--nproc-per-node", "cpu"}, env);
    CHECK(c.nproc_spec == "cpu");
    CHECK(c.nproc_var == "--nproc-per-node");
  }
  SECTION("PET_MASTER_* and PET_RDZV_ID win over MASTER_*") {
    const LaunchSettings s = resolve({}, {{"PET_NNODES", "2"},
                                          {"PET_NODE_RANK", "0"},
                                          {"PET_MASTER_ADDR", "a"},
                                          {"PET_MASTER_PORT", "9"},
                                          {"MASTER_ADDR", "b"},
                                          {"MASTER_PORT", "8"},
                                          {"PET_RDZV_ID", "job7"}});
    CHECK(s.master_addr == "a");
    CHECK(s.master_port == 9);
    CHECK(s.run_id == "job7");
  }
  SECTION("errors name the variable") {
    CHECK(error_of({}, {{"PET_NNODES", "1:4"}, {"PET_NODE_RANK", "0"}}) ==
          "PET_NNODES='1:4': an elastic range (MIN:MAX) needs a rendezvous endpoint: PET_RDZV_ENDPOINT "
          "(an elasticPolicy sets it) or --rdzv-endpoint HOST:PORT");
    CHECK(error_of({}, {{"PET_NNODES", "2"}}) == "Kubernetes PyTorchJob: PET_NODE_RANK is missing next to PET_NNODES");
    CHECK(error_of({}, {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "0"}, {"PET_NPROC_PER_NODE", "xpu"}}) ==
          "PET_NPROC_PER_NODE='xpu': expected an integer 1..4096, gpu, cpu or auto");
    CHECK(error_of({}, {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "3"}, {"MASTER_PORT", "5"}})
              .find("PET_NODE_RANK: 3 must be less than PET_NNODES 2") == 0);
    CHECK(error_of({}, {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}}).find("--master-port: required") == 0);
  }
}

TEST_CASE("resolve_launch: an elastic PyTorchJob - PET_NNODES MIN:MAX with a rendezvous endpoint",
          "[launch-env][k8s]") {
  // What training-operator v1 sets in every pod of a job with an elasticPolicy (minReplicas 2,
  // maxReplicas 3; pkg/controller.v1/pytorch/elastic.go), PET_RDZV_ENDPOINT being read by the CLI
  // as --rdzv-endpoint (torchrun's PET_* defaults, parse_cli(args, env)).
  const EnvMap env = {{"PET_RDZV_ENDPOINT", "job-worker-0:29400"},
                      {"PET_RDZV_BACKEND", "c10d"},
                      {"PET_NNODES", "2:3"},
                      {"PET_MAX_RESTARTS", "3"},
                      {"PET_NPROC_PER_NODE", "2"},
                      {"PYTHONUNBUFFERED", "0"}};
  const LaunchSettings s = resolve({}, env);
  CHECK(s.scheduler == Scheduler::PyTorchJob);
  CHECK(s.min_nnodes == 2);
  CHECK(s.nnodes == 3);
  CHECK_FALSE(s.node_rank_given);  // the rendezvous numbers the nodes
  CHECK(s.nproc_per_node == 2);
  CHECK(s.run_id == "pytorchjob-job-worker-0:29400");
  CHECK(s.detected ==
        "Kubernetes PyTorchJob: elastic, 2 to 3 nodes, node rank from the rendezvous at "
        "job-worker-0:29400, 2 workers per node");
  SECTION("PET_NODE_RANK (a job with a Master replica) is not read; PET_RDZV_ID is the run id") {
    EnvMap e = env;
    e["PET_NODE_RANK"] = "1";
    e["PET_RDZV_ID"] = "j7";
    const LaunchSettings t = resolve({}, e);
    CHECK_FALSE(t.node_rank_given);
    CHECK(t.run_id == "j7");
  }
  SECTION("MIN == MAX is a fixed count whose nodes the rendezvous numbers; so is a plain count") {
    for (const char* n : {"3:3", "3"}) {
      EnvMap e = env;
      e["PET_NNODES"] = n;
      const LaunchSettings t = resolve({}, e);
      CHECK(t.min_nnodes == 0);
      CHECK(t.nnodes == 3);
      CHECK_FALSE(t.node_rank_given);
      CHECK(t.detected.find("PyTorchJob: 3 nodes, node rank from the rendezvous at job-worker-0:29400") !=
            std::string::npos);
    }
  }
  SECTION("flags win") {
    const LaunchSettings t = resolve({"--nnodes", "4"}, env);
    CHECK(t.min_nnodes == 0);
    CHECK(t.nnodes == 4);
    CHECK(resolve({"--nnodes", "1:2"}, env).min_nnodes == 1);
  }
  SECTION("errors name what is wrong") {
    EnvMap e = env;
    e["PET_NNODES"] = "3:2";
    CHECK(error_of({}, e) == "PET_NNODES='3:2': MIN must not exceed MAX");
    e["PET_NNODES"] = "2:x";
    CHECK(error_of({}, e) == "PET_NNODES='2:x': expected N or MIN:MAX, integers 1..1048576");
    CHECK(error_of({"--node-rank", "1"}, env) ==
          "--node-rank: an elastic job (PET_NNODES 2:3) numbers its nodes at each rendezvous; leave --node-rank out");
    e = env;
    e.erase("PET_RDZV_ENDPOINT");
    CHECK(error_of({}, e).find("PET_NNODES='2:3': an elastic range (MIN:MAX) needs a rendezvous endpoint") == 0);
  }
}

TEST_CASE("resolve_launch: Slurm wins over PyTorchJob variables - flags over both", "[launch-env]") {
  EnvMap env = cluster_env("slurm-sbatch-srun-one-per-node.env", 0);
  env["PET_NNODES"] = "5";
  env["PET_NODE_RANK"] = "4";
  CHECK(resolve({}, env).scheduler == Scheduler::Slurm);
  CHECK(resolve({}, env).nnodes == 2);
  const LaunchSettings s = resolve({"--nnodes", "3", "--node-rank", "2"}, env);
  CHECK(s.nnodes == 3);
  CHECK(s.node_rank == 2);
}
