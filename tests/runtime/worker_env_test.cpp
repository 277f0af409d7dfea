#include <cstdlib>

#include "runtime/worker_env.hpp"
#include "support/cluster_env.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using lspawn::EnvError;
using lspawn::WorkerEnv;
using Vars = std::map<std::string, std::string>;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

namespace {

Vars minimal() { return {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29501"}}; }

Vars with(Vars v, const std::string& k, const std::string& value) {
  v[k] = value;
  return v;
}

Vars without(Vars v, const std::string& k) {
  v.erase(k);
  return v;
}

}  // namespace

TEST_CASE("WorkerEnv: minimal environment takes torchrun's defaults", "[unit][worker_env]") {
  const WorkerEnv e = WorkerEnv::from_map(minimal());
  CHECK(e.rank == 1);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.group_rank == 0);
  CHECK(e.group_world_size == 1);
  CHECK(e.role_rank == 1);
  CHECK(e.role_world_size == 4);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 29501);
  CHECK(e.run_id == "none");
  CHECK(e.restart_count == 0);
  CHECK(e.max_restarts == 0);
  CHECK(e.error_file.empty());
  CHECK_FALSE(e.use_agent_store);
}

TEST_CASE("WorkerEnv: every variable of the contract is read", "[unit][worker_env]") {
  const WorkerEnv e = WorkerEnv::from_map({{"RANK", "5"},
                                           {"LOCAL_RANK", "1"},
                                           {"WORLD_SIZE", "8"},
                                           {"LOCAL_WORLD_SIZE", "4"},
                                           {"GROUP_RANK", "1"},
                                           {"GROUP_WORLD_SIZE", "2"},
                                           {"ROLE_RANK", "3"},
                                           {"ROLE_WORLD_SIZE", "6"},
                                           {"MASTER_ADDR", "node0.example"},
                                           {"MASTER_PORT", "1234"},
                                           {"TORCHELASTIC_RUN_ID", "job-7"},
                                           {"TORCHELASTIC_RESTART_COUNT", "2"},
                                           {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                           {"TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"},
                                           {"LSPAWN_ERROR_FILE", "/tmp/ignored.json"},
                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  CHECK(e.rank == 5);
  CHECK(e.local_rank == 1);
  CHECK(e.world_size == 8);
  CHECK(e.local_world_size == 4);
  CHECK(e.group_rank == 1);
  CHECK(e.group_world_size == 2);
  CHECK(e.role_rank == 3);
  CHECK(e.role_world_size == 6);
  CHECK(e.master_addr == "node0.example");
  CHECK(e.master_port == 1234);
  CHECK(e.run_id == "job-7");
  CHECK(e.restart_count == 2);
  CHECK(e.max_restarts == 3);
  CHECK(e.error_file == "/tmp/x/error.json");
  CHECK(e.use_agent_store);
  CHECK(e.describe() == "rank 5/8 (local 1/4, node 1/2)");
}

TEST_CASE("WorkerEnv: LSPAWN_ERROR_FILE is the fallback error file", "[unit][worker_env]") {
  CHECK(WorkerEnv::from_map(with(minimal(), "LSPAWN_ERROR_FILE", "/e.json")).error_file == "/e.json");
  CHECK(WorkerEnv::from_map(with(with(minimal(), "LSPAWN_ERROR_FILE", "/e.json"), "TORCHELASTIC_ERROR_FILE", ""))
            .error_file == "/e.json");
}

TEST_CASE("WorkerEnv: missing required variables are named", "[unit][worker_env]") {
  CHECK_THROWS_WITH(WorkerEnv::from_map(without(minimal(), "RANK")),
                    Equals("RANK missing: set it or run under lspawn/torchrun"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(without(minimal(), "WORLD_SIZE")),
                    Equals("WORLD_SIZE missing: set it or run under lspawn/torchrun"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(without(minimal(), "MASTER_PORT")),
                    Equals("MASTER_PORT missing: set it or run under lspawn/torchrun"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "GROUP_WORLD_SIZE", "2")),
                    Contains("MASTER_ADDR missing") && Contains("GROUP_WORLD_SIZE=2"));
}

TEST_CASE("WorkerEnv: malformed values name the variable, the value and the form", "[unit][worker_env]") {
  CHECK_THROWS_AS(WorkerEnv::from_map(with(minimal(), "RANK", "x")), EnvError);
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "RANK", "x")), Equals("RANK='x' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "RANK", "1x")), Equals("RANK='1x' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "RANK", "")), Contains("RANK is set but empty"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "RANK", "-1")), Contains("RANK='-1' is out of range"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "RANK", "99999999999999999999")), Contains("is out of range"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "RANK", "5")), Equals("RANK=5 is not below WORLD_SIZE=4"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "WORLD_SIZE", "0")),
                    Contains("WORLD_SIZE='0' is out of range: expected 1.."));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "WORLD_SIZE", "four")),
                    Equals("WORLD_SIZE='four' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "LOCAL_RANK", "y")),
                    Equals("LOCAL_RANK='y' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(with(minimal(), "LOCAL_WORLD_SIZE", "2"), "LOCAL_RANK", "2")),
                    Equals("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "LOCAL_WORLD_SIZE", "5")),
                    Equals("LOCAL_WORLD_SIZE=5 is larger than WORLD_SIZE=4"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "GROUP_RANK", "1")),
                    Equals("GROUP_RANK=1 is not below GROUP_WORLD_SIZE=1"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "GROUP_WORLD_SIZE", "0")),
                    Contains("GROUP_WORLD_SIZE='0' is out of range"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "ROLE_RANK", "4")),
                    Equals("ROLE_RANK=4 is not below ROLE_WORLD_SIZE=4"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "ROLE_WORLD_SIZE", "z")),
                    Equals("ROLE_WORLD_SIZE='z' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "MASTER_ADDR", "")), Contains("MASTER_ADDR is set but empty"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "MASTER_PORT", "70000")),
                    Equals("MASTER_PORT='70000' is out of range: expected 0..65535"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "MASTER_PORT", "http")),
                    Equals("MASTER_PORT='http' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "MASTER_PORT", "0")),
                    Contains("MASTER_PORT=0 is only valid for WORLD_SIZE=1"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "TORCHELASTIC_RESTART_COUNT", "-2")),
                    Contains("TORCHELASTIC_RESTART_COUNT='-2' is out of range"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "TORCHELASTIC_MAX_RESTARTS", "many")),
                    Equals("TORCHELASTIC_MAX_RESTARTS='many' is not an integer"));
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(minimal(), "TORCHELASTIC_USE_AGENT_STORE", "maybe")),
                    Contains("TORCHELASTIC_USE_AGENT_STORE='maybe' is not a boolean"));
}

TEST_CASE("WorkerEnv: Open MPI's variables stand in when RANK is unset", "[unit][worker_env]") {
  const Vars ompi = {
      {"OMPI_COMM_WORLD_RANK", "3"},       {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_PORT", "29501"},      {"MASTER_ADDR", "h0"}};
  const WorkerEnv e = WorkerEnv::from_map(ompi);
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  // torchrun's names win: RANK set means Open MPI's are not read at all.
  const WorkerEnv t = WorkerEnv::from_map(with(with(ompi, "RANK", "0"), "WORLD_SIZE", "2"));
  CHECK(t.rank == 0);
  CHECK(t.world_size == 2);
  CHECK(t.local_rank == 0);
  CHECK(t.local_world_size == 2);
  // Malformed values are still named, under the name that was read.
  CHECK_THROWS_WITH(WorkerEnv::from_map(with(ompi, "OMPI_COMM_WORLD_SIZE", "x")), Contains("WORLD_SIZE='x'"));
}

TEST_CASE("WorkerEnv: MASTER_PORT=0 is accepted for a one-worker job", "[unit][worker_env]") {
  const WorkerEnv e = WorkerEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}});
  CHECK(e.master_port == 0);
}

TEST_CASE("WorkerEnv: from_environment reads the process environment", "[unit][worker_env]") {
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("MASTER_PORT", "4567", 1);
  ::setenv("TORCHELASTIC_RUN_ID", "from-env", 1);
  const WorkerEnv e = WorkerEnv::from_environment();
  ::setenv("RANK", "three", 1);
  CHECK_THROWS_WITH(WorkerEnv::from_environment(), Equals("RANK='three' is not an integer"));
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}) ::unsetenv(v);
  CHECK(e.rank == 2);
  CHECK(e.world_size == 3);
  CHECK(e.master_port == 4567);
  CHECK(e.run_id == "from-env");
  CHECK_THROWS_WITH(WorkerEnv::from_environment(), Contains("missing"));
}

TEST_CASE("duration_from_environment parses seconds", "[unit][worker_env]") {
  const char* name = "LSPAWN_TEST_DURATION";
  ::unsetenv(name);
  CHECK_FALSE(lspawn::duration_from_environment(name).has_value());
  ::setenv(name, "2.5", 1);
  CHECK(lspawn::duration_from_environment(name) == std::chrono::milliseconds(2500));
  ::setenv(name, "300", 1);
  CHECK(lspawn::duration_from_environment(name) == std::chrono::milliseconds(300000));
  ::setenv(name, "5s", 1);
  CHECK_THROWS_WITH(lspawn::duration_from_environment(name),
                    Equals("LSPAWN_TEST_DURATION='5s' is not a number of seconds (e.g. 300 or 2.5)"));
  ::setenv(name, "-1", 1);
  CHECK_THROWS_WITH(lspawn::duration_from_environment(name), Contains("out of range"));
  ::unsetenv(name);
}

TEST_CASE("WorkerEnv: Open MPI completes the group, port and run id", "[unit][worker_env][ompi]") {
  // mpirun -np 4 on one node (tests/data: OMPI 4.1.4's variables of rank 2).
  Vars ompi = {{"OMPI_COMM_WORLD_RANK", "2"},       {"OMPI_COMM_WORLD_SIZE", "4"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
               {"OMPI_COMM_WORLD_NODE_RANK", "2"},  {"OMPI_MCA_ess_base_jobid", "1546256385"},
               {"OMPI_MCA_orte_num_nodes", "1"},    {"PMIX_RANK", "2"}};
  WorkerEnv e = WorkerEnv::from_map(ompi);
  CHECK(e.rank == 2);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 2);
  CHECK(e.local_world_size == 4);
  CHECK(e.group_rank == 0);
  CHECK(e.group_world_size == 1);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 15000 + 1546256385 % 10000);
  CHECK(e.run_id == "ompi-1546256385");
  // mpirun -x MASTER_PORT / TORCHELASTIC_RUN_ID win over the derived ones
  e = WorkerEnv::from_map(with(with(ompi, "MASTER_PORT", "29999"), "TORCHELASTIC_RUN_ID", "r"));
  CHECK(e.master_port == 29999);
  CHECK(e.run_id == "r");
  // Two nodes, two slots each: node rank derived; MASTER_ADDR required.
  ompi["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  ompi["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  ompi["OMPI_MCA_orte_num_nodes"] = "2";
  CHECK_THROWS_WITH(WorkerEnv::from_map(ompi),
                    Contains("MASTER_ADDR missing: the ranks of this mpirun span several nodes "
                             "(OMPI_COMM_WORLD_LOCAL_SIZE=2 < OMPI_COMM_WORLD_SIZE=4)"));
  e = WorkerEnv::from_map(with(ompi, "MASTER_ADDR", "h0"));
  CHECK(e.group_rank == 1);
  CHECK(e.group_world_size == 2);
  CHECK(e.master_addr == "h0");
}

TEST_CASE("WorkerEnv: srun -N2 -n4 prog, one task per worker (captured env)", "[unit][worker_env][slurm]") {
  for (int task = 0; task < 4; ++task) {
    INFO("task " << task);
    const WorkerEnv e = WorkerEnv::from_map(lspawn::test::cluster_env("slurm-srun-N2-n4-loopback.env", task));
    CHECK(e.rank == task);            // SLURM_PROCID
    CHECK(e.world_size == 4);         // SLURM_STEP_NUM_TASKS / SLURM_NTASKS
    CHECK(e.local_rank == task % 2);  // SLURM_LOCALID
    CHECK(e.local_world_size == 2);   // 2(x2)[SLURM_NODEID]
    CHECK(e.group_rank == task / 2);  // SLURM_NODEID
    CHECK(e.group_world_size == 2);
    CHECK(e.master_addr == "n1");   // first host of n[1-2]
    CHECK(e.master_port == 15003);  // 15000 + job 3
    CHECK(e.run_id == "3");
  }
}

TEST_CASE("WorkerEnv: Slurm variations and errors", "[unit][worker_env][slurm]") {
  Vars env = lspawn::test::cluster_env("slurm-srun-N2-n4-loopback.env", 3);
  SECTION("uneven packing 3,1: the node's own count") {
    env["SLURM_STEP_TASKS_PER_NODE"] = "3,1";
    env["SLURM_LOCALID"] = "0";
    const WorkerEnv e = WorkerEnv::from_map(env);
    CHECK(e.local_world_size == 1);
    CHECK(e.local_rank == 0);
  }
  SECTION("MASTER_ADDR / MASTER_PORT exported win") {
    env["MASTER_ADDR"] = "head";
    env["MASTER_PORT"] = "24000";
    const WorkerEnv e = WorkerEnv::from_map(env);
    CHECK(e.master_addr == "head");
    CHECK(e.master_port == 24000);
  }
  SECTION("full hostlist syntax") {
    env["SLURM_STEP_NODELIST"] = "gpu-a[07-08]";
    CHECK(WorkerEnv::from_map(env).master_addr == "gpu-a07");
  }
  SECTION("errors name the variable") {
    env["SLURM_STEP_NODELIST"] = "n[1-";
    CHECK_THROWS_WITH(WorkerEnv::from_map(env), Equals("SLURM_STEP_NODELIST='n[1-': '[' at offset 1 is never closed"));
    env["SLURM_STEP_NODELIST"] = "n[1-2]";
    env["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
    CHECK_THROWS_WITH(WorkerEnv::from_map(env), Contains("SLURM_STEP_TASKS_PER_NODE='2(x'"));
    env["SLURM_STEP_TASKS_PER_NODE"] = "2(x3)";
    CHECK_THROWS_WITH(WorkerEnv::from_map(env),
                      Equals("SLURM_STEP_TASKS_PER_NODE='2(x3)' describes 3 nodes but SLURM_STEP_NUM_NODES=2"));
    env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
    env["SLURM_PROCID"] = "x";
    CHECK_THROWS_WITH(WorkerEnv::from_map(env), Equals("RANK='x' is not an integer"));
    env.erase("SLURM_PROCID");
    CHECK_THROWS_WITH(WorkerEnv::from_map(env),
                      Equals("SLURM_PROCID missing in a Slurm job step (SLURM_STEP_ID is set)"));
  }
  SECTION("the batch script is not a task") {
    CHECK_THROWS_WITH(WorkerEnv::from_map(lspawn::test::cluster_env("slurm-sbatch-script-N2-tpn2.env")),
                      Contains("SLURM_PROCID is set but SLURM_STEP_ID is not"));
  }
  SECTION("torchrun's names win: lspawn under srun sets RANK for its workers") {
    env["RANK"] = "1";
    env["WORLD_SIZE"] = "2";
    env["LOCAL_WORLD_SIZE"] = "2";
    env["LOCAL_RANK"] = "1";
    env["MASTER_PORT"] = "5";
    const WorkerEnv e = WorkerEnv::from_map(env);
    CHECK(e.rank == 1);
    CHECK(e.world_size == 2);
    CHECK(e.master_port == 5);
  }
}

TEST_CASE("WorkerEnv: mpirun inside sbatch prefers OMPI over orted's SLURM_*", "[unit][worker_env][ompi][slurm]") {
  // Rank 3 of `mpirun -np 4` in a 2-node job: orted was started by srun, so SLURM_PROCID is the
  // node index and SLURM_NTASKS the node count (tests/data/cluster-env/ompi-mpirun-inside-sbatch.env).
  const Vars env = {{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"PMIX_RANK", "3"},
                    {"SLURMD_NODENAME", "n2"},
                    {"SLURM_PROCID", "1"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_NODEID", "1"},
                    {"SLURM_NTASKS", "2"},
                    {"SLURM_STEP_ID", "0"},
                    {"SLURM_JOB_NUM_NODES", "2"},
                    {"SLURM_JOB_ID", "9"},
                    {"MASTER_ADDR", "n1"},
                    {"MASTER_PORT", "29500"}};
  const WorkerEnv e = WorkerEnv::from_map(env);
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
}
