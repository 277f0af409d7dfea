// The environment contract (DESIGN.md §2) as workers see it.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include <unistd.h>

#include "harness.hpp"

using namespace lspawn::test;

namespace {
// rank -> (name -> value), from "[rank N] NAME=value" lines.
std::map<int, std::map<std::string, std::string>> parse_env(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> m;
  for (const auto& l : lines(out)) {
    int rank;
    char rest[4096];
    if (std::sscanf(l.c_str(), "[rank %d] %4095[^\n]", &rank, rest) != 2) continue;
    std::string kv = rest;
    auto eq = kv.find('=');
    if (eq != std::string::npos) m[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}
}  // namespace

TEST_CASE("each worker gets torchrun's environment contract", "[e2e][env]") {
  auto r = run_lspawn({"--nprocs", "3", "--run-id", "job42", worker_bin(), "env"},
                      {"LSPAWN_TEST_INHERITED=yes"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto env = parse_env(r.out);
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
  auto env = parse_env(r.out);
  CHECK(env[0]["OMP_NUM_THREADS"] == "3");
  CHECK(env[1]["OMP_NUM_THREADS"] == "3");
  CHECK(r.err.find("OMP_NUM_THREADS") == std::string::npos);

  r = run_lspawn({worker_bin(), "env"}, {});
  REQUIRE(r.exit_code == 0);
  env = parse_env(r.out);
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

// Detection through the binary: node 1 of a 2-node job needs node 0's lspawn (multi-node), and
// the detected master (n07, job-master-0) does not resolve here, so each run stops at the
// rendezvous with exit 122 naming the host:port it was sent to — which is what detection gave it.
// The workers' variables of a real multi-node meet: multinode_e2e_test.cpp; the detected settings
// field by field: tests/launcher (resolve_launch).
TEST_CASE("under srun, lspawn takes node rank, nodes, master, port and run id from Slurm", "[e2e][env][slurm]") {
  const std::vector<std::string> slurm = {
      "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0", "SLURM_NODEID=1", "SLURM_STEP_NUM_NODES=2",
      "SLURM_STEP_NODELIST=n[07-08]", "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_PROCID=1"};
  auto r = run_lspawn({"--nprocs", "2", worker_bin(), "env"}, slurm);
  INFO(r.err);
  CHECK(r.err.find("lspawn: Slurm job 4242: node 1 of 2, master n07:19242, 2 workers per node") != std::string::npos);
  CHECK(r.exit_code == 122);
  CHECK(r.err.find("rendezvous on n07:19242") != std::string::npos);
  // Several lspawn per node would start the job twice: refused with exit 2.
  std::vector<std::string> two = slurm;
  two[5] = "SLURM_STEP_TASKS_PER_NODE=2(x2)";
  r = run_lspawn({worker_bin(), "env"}, two);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("SLURM_STEP_TASKS_PER_NODE=2(x2): lspawn must run once per node") != std::string::npos);
}

TEST_CASE("in a PyTorchJob pod, lspawn takes the node from PET_*", "[e2e][env][k8s]") {
  auto r = run_lspawn({worker_bin(), "env"},
                      {"MASTER_ADDR=job-master-0", "MASTER_PORT=23456", "WORLD_SIZE=4", "RANK=1",
                       "PET_NNODES=2", "PET_NODE_RANK=1", "PET_NPROC_PER_NODE=2"});
  INFO(r.err);
  CHECK(r.err.find("lspawn: Kubernetes PyTorchJob: node 1 of 2, master job-master-0:23456, 2 workers per node") !=
        std::string::npos);
  CHECK(r.exit_code == 122);
  CHECK(r.err.find("rendezvous on job-master-0:23456") != std::string::npos);
}

TEST_CASE("every worker of a run gets the same fresh job secret; lspawn never prints it", "[e2e][env][security][exec-only]") {
  auto digest = [](const RunResult& r) {
    std::vector<std::string> d;
    for (const auto& l : lines(r.out)) {
      if (l.find("secret ") != std::string::npos) d.push_back(l.substr(l.find("secret ") + 7));
    }
    return d;
  };
  const std::vector<std::string> args{"--nprocs", "2", "/bin/sh", "-c",
                                      "echo secret ${#LSPAWN_JOB_SECRET} $(printf %s \"$LSPAWN_JOB_SECRET\" | md5sum)"};
  auto a = run_lspawn(args, {"LSPAWN_JOB_SECRET="});
  auto b = run_lspawn(args);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  const auto da = digest(a), db = digest(b);
  REQUIRE(da.size() == 2);
  REQUIRE(db.size() == 2);
  CHECK(da[0].rfind("64 ", 0) == 0);
  CHECK(da[0] == da[1]);  // one secret per run
  CHECK(da[0] != db[0]);  // a fresh one each run
  CHECK(a.err.find("LSPAWN_JOB_SECRET") == std::string::npos);
}
