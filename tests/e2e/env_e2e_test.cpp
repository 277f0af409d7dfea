// The environment contract (docs/env-contract.md) as workers see it.
#include <catch2/catch.hpp>

#include <algorithm>

#include <map>
#include <set>

#include <unistd.h>

#include <sys/wait.h>

#include "harness.hpp"
#include "supervisor/port.hpp"
#include "placement/binding.hpp"

using namespace lspawn::test;

TEST_CASE("each worker gets torchrun's environment contract", "[e2e][env]") {
  auto r = run_lspawn({"--nprocs", "3", "--run-id", "job42", worker_bin(), "env"}, {"LSPAWN_TEST_INHERITED=yes"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto env = env_by_rank(r.out);
  REQUIRE(env.size() == 3);
  std::set<std::string> ports, error_files;
  for (int rank = 0; rank < 3; ++rank) {
    auto& e = env[rank];
    CHECK(e["RANK"] == std::to_string(rank));
    CHECK(e["LOCAL_RANK"] == std::to_string(rank));
    CHECK(e["WORLD_SIZE"] == "3");
    CHECK(e["LOCAL_WORLD_SIZE"] == "3");
    CHECK(e["GROUP_RANK"] == "0");
    CHECK(e["GROUP_WORLD_SIZE"] == "1");
    CHECK(e["ROLE_RANK"] == std::to_string(rank));
    CHECK(e["ROLE_WORLD_SIZE"] == "3");
    CHECK(e["ROLE_NAME"] == "default");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["TORCHELASTIC_RUN_ID"] == "job42");
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(e["TORCHELASTIC_MAX_RESTARTS"] == "0");
    CHECK(e["TORCHELASTIC_USE_AGENT_STORE"] == "False");
    CHECK(e["OMP_NUM_THREADS"] == "1");
    CHECK(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(e["LSPAWN_TEST_INHERITED"] == "yes");
    CHECK(e["LSPAWN_FORKSERVER_FDS"] == "<unset>");  // the forkserver's own, never a worker's
    CHECK(e["LSPAWN_ERROR_FILE"] == e["TORCHELASTIC_ERROR_FILE"]);
    CHECK(e["TORCHELASTIC_ERROR_FILE"].rfind(e["LSPAWN_RUN_DIR"] + "/", 0) == 0);
    ports.insert(e["MASTER_PORT"]);
    error_files.insert(e["TORCHELASTIC_ERROR_FILE"]);
  }
  CHECK(ports.size() == 1);
  CHECK(std::stoi(*ports.begin()) > 0);
  CHECK(error_files.size() == 3);
  CHECK(r.err.find("OMP_NUM_THREADS=1") != std::string::npos);
  // The private run directory is gone after the run.
  CHECK(access(env[0]["LSPAWN_RUN_DIR"].c_str(), F_OK) != 0);
}

TEST_CASE("OMP_NUM_THREADS set by the user is kept - one worker gets no default", "[e2e][env]") {
  auto r = run_lspawn({"--nprocs", "2", worker_bin(), "env"}, {"OMP_NUM_THREADS=3"});
  REQUIRE(r.exit_code == 0);
  auto env = env_by_rank(r.out);
  CHECK(env[0]["OMP_NUM_THREADS"] == "3");
  CHECK(env[1]["OMP_NUM_THREADS"] == "3");
  CHECK(r.err.find("OMP_NUM_THREADS") == std::string::npos);

  r = run_lspawn({worker_bin(), "env"}, {});
  REQUIRE(r.exit_code == 0);
  env = env_by_rank(r.out);
  if (!getenv("OMP_NUM_THREADS")) CHECK(env[0]["OMP_NUM_THREADS"] == "<unset>");
}

// --nnodes/--node-rank (global ranks, GROUP_RANK, LOCAL_WORLD_SIZE, ...): a node other than 0
// now needs node 0's lspawn, see multinode_e2e_test.cpp ("static multi-node: ...").

TEST_CASE("workers inherit no fd but stdin - stdout and stderr", "[e2e][env]") {
  // Not the port reservation, the guardian socket, other workers' pipes, pidfds or the signalfd.
  auto r = run_lspawn({"--quiet", "--nprocs", "3", worker_bin(), "fds"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(count(r.out, "] fds 0 1 2\n") == 3);
}

// Two "nodes" on this machine (two lspawns on 127.0.0.1, as tests/e2e/multinode_e2e_test.cpp):
// a multi-node lspawn needs its peers, node 0's lspawn hosting the rendezvous.
namespace {
// Runs node 1 then node 0 of a two-node job, each with its own environment; {node0, node1}.
std::pair<RunResult, RunResult> run_two_nodes(const std::vector<std::string>& args,
                                              const std::vector<std::string>& env0,
                                              const std::vector<std::string>& env1) {
  std::vector<std::string> argv = {lspawn_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv = with_start_method(argv);
  Child b(argv, env1);  // the member first: it waits for node 0
  Child a(argv, env0);
  RunResult ra, rb;
  ra.exit_code = code_of(a.wait());
  rb.exit_code = code_of(b.wait());
  ra.out = a.out(), ra.err = a.err(), rb.out = b.out(), rb.err = b.err();
  return {ra, rb};
}
}  // namespace

TEST_CASE("under srun, lspawn takes node rank, nodes, master, port and run id from Slurm", "[e2e][env][slurm]") {
  // A 2-node step; both "nodes" are this machine (the nodelist's first host is 127.0.0.1) and
  // MASTER_PORT is exported (else 15000 + job id % 10000).
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  auto slurm = [&](int node) {
    return std::vector<std::string>{"SLURM_JOB_ID=4242",
                                    "SLURM_STEP_ID=0",
                                    "SLURM_NODEID=" + std::to_string(node),
                                    "SLURM_STEP_NUM_NODES=2",
                                    "SLURM_STEP_NODELIST=127.0.0.1,localhost",
                                    "SLURM_STEP_TASKS_PER_NODE=1(x2)",
                                    "SLURM_PROCID=" + std::to_string(node),
                                    "MASTER_PORT=" + port};
  };
  auto [r0, r1] = run_two_nodes({"--nprocs", "2", worker_bin(), "env"}, slurm(0), slurm(1));
  INFO(r0.err << r1.err);
  REQUIRE(r0.exit_code == 0);
  REQUIRE(r1.exit_code == 0);
  CHECK(r1.err.find("lspawn: Slurm job 4242: node 1 of 2, master 127.0.0.1:" + port + ", 2 workers per node") !=
        std::string::npos);
  auto env = env_by_rank(r1.out);
  REQUIRE(env.count(3));
  CHECK(env[3]["RANK"] == "3");
  CHECK(env[3]["WORLD_SIZE"] == "4");
  CHECK(env[3]["GROUP_RANK"] == "1");
  CHECK(env[3]["GROUP_WORLD_SIZE"] == "2");
  CHECK(env[3]["MASTER_ADDR"] == "127.0.0.1");
  CHECK(env[3]["TORCHELASTIC_RUN_ID"] == "4242");
  CHECK(env_by_rank(r0.out).count(0) == 1);
  // Several lspawn per node would start the job twice: refused with exit 2.
  std::vector<std::string> two = slurm(1);
  two[5] = "SLURM_STEP_TASKS_PER_NODE=2(x2)";
  auto r = run_lspawn({worker_bin(), "env"}, two);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("SLURM_STEP_TASKS_PER_NODE=2(x2): lspawn must run once per node") != std::string::npos);
}

TEST_CASE("in a PyTorchJob pod, lspawn takes the node from PET_*", "[e2e][env][k8s]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  auto pod = [&](int node) {
    return std::vector<std::string>{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                    "WORLD_SIZE=4",          "RANK=" + std::to_string(node),
                                    "PET_NNODES=2",          "PET_NODE_RANK=" + std::to_string(node),
                                    "PET_NPROC_PER_NODE=2"};
  };
  auto [r0, r1] = run_two_nodes({worker_bin(), "env"}, pod(0), pod(1));
  INFO(r0.err << r1.err);
  REQUIRE(r0.exit_code == 0);
  REQUIRE(r1.exit_code == 0);
  CHECK(r1.err.find("lspawn: Kubernetes PyTorchJob: node 1 of 2, master 127.0.0.1:" + port + ", 2 workers per node") !=
        std::string::npos);
  auto env = env_by_rank(r1.out);
  REQUIRE(env.count(2));
  CHECK(env[2]["RANK"] == "2");
  CHECK(env[2]["WORLD_SIZE"] == "4");
  CHECK(env[2]["LOCAL_RANK"] == "0");
  CHECK(env[2]["MASTER_ADDR"] == "127.0.0.1");
}

TEST_CASE("torchrun's PET_* defaults: PET_MAX_RESTARTS and PET_ROLE act as the flags, the command line wins",
          "[e2e][env][k8s][exec-only]") {
  const std::string script =
      "if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 5; fi; "
      "echo \"ok rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS role=$ROLE_NAME\"";
  auto r = run_lspawn({"--nprocs", "2", "/bin/sh", "-c", script}, {"PET_MAX_RESTARTS=2", "PET_ROLE=trainer"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[rank 1] ok rank=1 restart=1 max=2 role=trainer\n") != std::string::npos);
  CHECK(r.err.find(
            "lspawn: from the environment (torchrun's PET_* defaults): PET_MAX_RESTARTS=2, PET_ROLE=trainer\n") == 0);
  // --max-restarts 0 on the command line: no restart, rank 1's exit code is the job's.
  auto once = run_lspawn({"--nprocs", "2", "--max-restarts", "0", "/bin/sh", "-c", script}, {"PET_MAX_RESTARTS=2"});
  CHECK(once.exit_code == 5);
  // A bad value: exit 2, the variable named, nothing started.
  auto bad = run_lspawn({"--nprocs", "2", "/bin/sh", "-c", "echo started"}, {"PET_MAX_RESTARTS=-1"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("lspawn: PET_MAX_RESTARTS='-1' (torchrun's environment default of --max-restarts): ") == 0);
  CHECK(bad.out.find("started") == std::string::npos);
}

TEST_CASE("OMP_NUM_THREADS: each worker's share of the CPUs lspawn may use, said once, --omp-threads over all",
          "[e2e][env][exec-only]") {  // exec-only: its Slurm case runs /bin/sh, which no forkserver can start
  const int cpus = lspawn::placement::usable_cpu_count();
  const int share = std::max(1, cpus / 2);
  auto r = run_lspawn({"--nprocs", "2", worker_bin(), "env"}, {});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto env = env_by_rank(r.out);
  CHECK(env[0]["OMP_NUM_THREADS"] == std::to_string(share));
  CHECK(env[1]["OMP_NUM_THREADS"] == std::to_string(share));
  CHECK(r.err.find("lspawn: setting OMP_NUM_THREADS=" + std::to_string(share) +
                   " for each of the 2 workers of this node (its share of " + std::to_string(cpus) + " CPU" +
                   (cpus == 1 ? "" : "s") + " lspawn may use); set OMP_NUM_THREADS or --omp-threads to override\n") !=
        std::string::npos);
  // --omp-threads: every worker, over the environment's value, nothing said.
  r = run_lspawn({"--nprocs", "2", "--omp-threads", "3", worker_bin(), "env"}, {"OMP_NUM_THREADS=5"});
  REQUIRE(r.exit_code == 0);
  env = env_by_rank(r.out);
  CHECK(env[0]["OMP_NUM_THREADS"] == "3");
  CHECK(env[1]["OMP_NUM_THREADS"] == "3");
  CHECK(r.err.find("OMP_NUM_THREADS") == std::string::npos);
  // Under Slurm (one node, not a step), a SLURM_CPUS_PER_TASK that is no count: exit 2, named, nothing started.
  r = run_lspawn({"--nprocs", "2", "/bin/sh", "-c", "echo started"}, {"SLURM_JOB_ID=7", "SLURM_CPUS_PER_TASK=lots"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("lspawn: SLURM_CPUS_PER_TASK='lots': not a count of CPUs (an integer >= 1)") != std::string::npos);
  CHECK(r.out.find("started") == std::string::npos);
  // ... and a good one, fewer than lspawn's CPUs, is the count shared.
  if (cpus >= 2) {
    r = run_lspawn({"--nprocs", "1", worker_bin(), "env"}, {"SLURM_JOB_ID=7", "SLURM_CPUS_PER_TASK=1"});
    REQUIRE(r.exit_code == 0);
    CHECK(env_by_rank(r.out)[0]["OMP_NUM_THREADS"] == "1");
    CHECK(r.err.find("(its share of SLURM_CPUS_PER_TASK=1)") != std::string::npos);
  }
}

TEST_CASE(
    "numa binding: --numa-binding places each worker on its CPUs before it runs, says so, and OMP_NUM_THREADS follows",
    "[e2e][env][numa]") {
  // This machine as lspawn reads it (the rules themselves: tests/placement); no GPU here, so the
  // ranks are placed over the NUMA nodes. Under forkserver and warm the forked worker binds itself.
  using namespace lspawn::placement;
  const Topology topo = read_topology();
  const CpuList allowed = current_affinity();
  std::set<int> cores;
  for (int c : allowed) cores.insert(topo.cpu(c) ? topo.cpu(c)->core : c);
  const Mode mode = cores.size() >= 2 ? Mode::Exclusive : Mode::Node;
  const auto want = place(topo, mode, 2, {}, allowed);
  auto r = run_lspawn({"--nprocs", "2", "--numa-binding", mode_name(mode), worker_bin(), "affinity"}, {});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("lspawn: --numa-binding " + std::string(mode_name(mode)) + ": " + placement_text(topo, want, 0) +
                   "; OMP_NUM_THREADS = each rank's CPU count\n") != std::string::npos);
  for (int rank = 0; rank < 2; ++rank) {
    const CpuList& cpus = want[static_cast<size_t>(rank)].cpus;
    std::string list;
    for (int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
    CHECK(r.out.find("[rank " + std::to_string(rank) + "] cpus " + list + " omp " + std::to_string(cpus.size()) +
                     " env " + cpu_list_text(cpus) + "\n") != std::string::npos);
  }
  // The user's OMP_NUM_THREADS stays.
  r = run_lspawn({"--nprocs", "2", "--numa-binding", "node", worker_bin(), "affinity"}, {"OMP_NUM_THREADS=3"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("[rank 0] cpus ") != std::string::npos);
  CHECK(r.out.find(" omp 3 env ") != std::string::npos);
  CHECK(r.err.find("OMP_NUM_THREADS = each rank's CPU count") == std::string::npos);
  // More ranks than cores for exclusive: exit 2, said, nothing started.
  const std::string too_many = std::to_string(cores.size() + 1);
  r = run_lspawn({"--nprocs", too_many, "--numa-binding", "exclusive", worker_bin(), "affinity"}, {});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("lspawn: --numa-binding exclusive: NUMA node ") == 0);
  CHECK(r.err.find("physical core") != std::string::npos);
  CHECK(r.out.find("cpus") == std::string::npos);
}

TEST_CASE(
    "in a pod with PET_NPROC_PER_NODE=cpu|gpu (torchrun's forms), lspawn counts the workers - or names the variable",
    "[e2e][env][k8s]") {
  ReservedPort held_port;
  const std::vector<std::string> pod = {"PET_NNODES=1", "PET_NODE_RANK=0", "MASTER_ADDR=127.0.0.1",
                                        "MASTER_PORT=" + std::to_string(held_port.port())};
  const int cpus = lspawn::placement::usable_cpu_count();
  std::vector<std::string> env = pod;
  env.push_back("PET_NPROC_PER_NODE=cpu");
  auto r = run_lspawn({worker_bin(), "env"}, env);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("lspawn: Kubernetes PyTorchJob: node 0 of 1, master 127.0.0.1:" + pod[3].substr(12) +
                   ", workers per node: cpu (PET_NPROC_PER_NODE)\n") != std::string::npos);
  CHECK(r.err.find("lspawn: PET_NPROC_PER_NODE=cpu: " + std::to_string(cpus) + " worker") != std::string::npos);
  for (int rank = 0; rank < cpus; ++rank) {
    CHECK(r.out.find("[rank " + std::to_string(rank) + "] WORLD_SIZE=" + std::to_string(cpus) + "\n") !=
          std::string::npos);
  }
  CHECK(r.out.find("[rank " + std::to_string(cpus) + "]") == std::string::npos);
  // No GPU visible: exit 2 naming the variable, nothing started.
  env = pod;
  env.push_back("PET_NPROC_PER_NODE=gpu");
  env.push_back("CUDA_VISIBLE_DEVICES=");
  r = run_lspawn({worker_bin(), "env"}, env);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("lspawn: PET_NPROC_PER_NODE=gpu: --nproc-per-node gpu: no NVIDIA GPU is visible to this process "
                   "(CUDA_VISIBLE_DEVICES='')") != std::string::npos);
  CHECK(r.out.empty());
}
