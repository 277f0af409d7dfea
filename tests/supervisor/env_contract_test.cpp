#include <catch2/catch.hpp>

#include <map>
#include <stdexcept>

#include "supervisor/env_contract.hpp"

namespace env = lspawn::env;

namespace {
std::map<std::string, std::string> as_map(const std::vector<std::string>& v) {
  std::map<std::string, std::string> m;
  for (const auto& kv : v) {
    auto eq = kv.find('=');
    REQUIRE(m.count(kv.substr(0, eq)) == 0);  // each name once
    m[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}
}  // namespace

TEST_CASE("worker_environment: torchrun's names from the worker's place", "[env]") {
  env::JobEnv job;
  job.master_addr = "10.0.0.1";
  job.master_port = 4242;
  job.run_id = "rid";
  job.run_dir = "/tmp/run";
  job.omp_threads = 1;
  env::WorkerPlace place{1, 4, 2, 3};  // local 1 of 4, node 2 of 3
  auto m = as_map(env::worker_environment(job, place, {"PATH=/bin", "RANK=stale", "OTHER=x"}));
  CHECK(m["RANK"] == "9");
  CHECK(m["LOCAL_RANK"] == "1");
  CHECK(m["WORLD_SIZE"] == "12");
  CHECK(m["LOCAL_WORLD_SIZE"] == "4");
  CHECK(m["GROUP_RANK"] == "2");
  CHECK(m["GROUP_WORLD_SIZE"] == "3");
  CHECK(m["ROLE_RANK"] == "9");
  CHECK(m["ROLE_WORLD_SIZE"] == "12");
  CHECK(m["ROLE_NAME"] == "default");
  CHECK(m["MASTER_ADDR"] == "10.0.0.1");
  CHECK(m["MASTER_PORT"] == "4242");
  CHECK(m["TORCHELASTIC_RUN_ID"] == "rid");
  CHECK(m["TORCHELASTIC_RESTART_COUNT"] == "0");
  CHECK(m["TORCHELASTIC_MAX_RESTARTS"] == "0");
  CHECK(m["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  CHECK(m["TORCHELASTIC_ERROR_FILE"] == "/tmp/run/error-9.json");
  CHECK(m["LSPAWN_ERROR_FILE"] == "/tmp/run/error-9.json");
  CHECK(m["LSPAWN_RUN_DIR"] == "/tmp/run");
  CHECK(m["OMP_NUM_THREADS"] == "1");
  CHECK(m["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");  // torchrun's default
  CHECK(m["PATH"] == "/bin");
  CHECK(m["OTHER"] == "x");
}

TEST_CASE(
    "worker_environment: TORCH_NCCL_ASYNC_ERROR_HANDLING is 1 unless the launcher's environment says (either name)",
    "[env]") {
  env::JobEnv job;
  const env::WorkerPlace one{0, 1, 0, 1};
  CHECK(as_map(env::worker_environment(job, one, {"A=1"}))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(as_map(env::worker_environment(
            job, one, {"TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3");
  auto m = as_map(env::worker_environment(job, one, {"NCCL_ASYNC_ERROR_HANDLING=0"}));
  CHECK(m.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0);  // the user's older name stays in charge
  CHECK(m["NCCL_ASYNC_ERROR_HANDLING"] == "0");
}

TEST_CASE(
    "worker_environment: GLOO_ENABLE_STORE_V2_API is 1 (gloo's batched connect) unless the launcher's environment says",
    "[env]") {
  env::JobEnv job;
  const env::WorkerPlace one{0, 1, 0, 1};
  CHECK(as_map(env::worker_environment(job, one, {"A=1"}))["GLOO_ENABLE_STORE_V2_API"] == "1");
  CHECK(as_map(env::worker_environment(job, one, {"GLOO_ENABLE_STORE_V2_API=0"}))["GLOO_ENABLE_STORE_V2_API"] == "0");
}

TEST_CASE("worker_environment: --virtual-local-rank - LOCAL_RANK=0 and the worker's one device, as torchrun picks it",
          "[env]") {
  env::JobEnv job;
  job.virtual_local_rank = true;
  const env::WorkerPlace second{1, 2, 3, 4};  // local rank 1 of node 3
  // CUDA_VISIBLE_DEVICES: the entry of the local rank (spaces trimmed, as torchrun's strip()).
  auto m = as_map(env::worker_environment(job, second, {"CUDA_VISIBLE_DEVICES=4, 6"}));
  CHECK(m["LOCAL_RANK"] == "0");
  CHECK(m["RANK"] == "7");
  CHECK(m["LOCAL_WORLD_SIZE"] == "2");
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "6");
  CHECK(m.count("HIP_VISIBLE_DEVICES") == 0);
  // None set: the local rank itself.
  m = as_map(env::worker_environment(job, second, {"PATH=/bin"}));
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "1");
  // HIP_VISIBLE_DEVICES (ROCm) wins when set and not empty, and is set too.
  m = as_map(env::worker_environment(job, second, {"HIP_VISIBLE_DEVICES=2,3", "CUDA_VISIBLE_DEVICES=0,1"}));
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "3");
  CHECK(m["HIP_VISIBLE_DEVICES"] == "3");
  m = as_map(env::worker_environment(job, second, {"HIP_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b"}));
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "GPU-b");
  CHECK(m["HIP_VISIBLE_DEVICES"].empty());
  // A list without the local rank's entry names the variable and its value.
  auto why = [](const std::vector<std::string>& base, int lr) -> std::string {
    try {
      env::virtual_visible_device(base, lr);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK(why({"CUDA_VISIBLE_DEVICES=0"}, 1) == "local rank 1 has no device in CUDA_VISIBLE_DEVICES='0' (1 entry)");
  CHECK(why({"CUDA_VISIBLE_DEVICES="}, 0) == "local rank 0 has no device in CUDA_VISIBLE_DEVICES='' (0 entries)");
  CHECK(why({"HIP_VISIBLE_DEVICES=0,,2"}, 1) == "local rank 1 has no device in HIP_VISIBLE_DEVICES='0,,2' (3 entries)");
  // Off: LOCAL_RANK is the local rank and CUDA_VISIBLE_DEVICES is inherited as it is.
  job.virtual_local_rank = false;
  m = as_map(env::worker_environment(job, second, {"CUDA_VISIBLE_DEVICES=4,6"}));
  CHECK(m["LOCAL_RANK"] == "1");
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "4,6");
}

TEST_CASE("OMP_NUM_THREADS default: each worker's share of the CPUs, at least 1, unless the user set it", "[env]") {
  // Several workers: the CPUs split between them, rounded down, never below 1.
  CHECK(env::omp_threads_default({"A=1"}, 2, 16).threads == 8);
  CHECK(env::omp_threads_default({"A=1"}, 3, 16).threads == 5);
  CHECK(env::omp_threads_default({"A=1"}, 4, 2).threads == 1);
  CHECK(env::omp_threads_default({"A=1"}, 2, 16).why == "16 CPUs lspawn may use");
  CHECK(env::omp_threads_default({"A=1"}, 2, 1).why == "1 CPU lspawn may use");
  // One worker outside Slurm: left to OpenMP (its default is that share already).
  CHECK(env::omp_threads_default({"A=1"}, 1, 16).threads == 0);
  // The user's variable wins, whatever its value; a longer name is not it.
  CHECK(env::omp_threads_default({"OMP_NUM_THREADS=8"}, 2, 16).threads == 0);
  CHECK(env::omp_threads_default({"OMP_NUM_THREADS_X=8", "OMP_NUM_THREADS=2"}, 4, 16).threads == 0);
  CHECK(env::omp_threads_default({"OMP_NUM_THREADS_X=8"}, 4, 16).threads == 4);
}

TEST_CASE("OMP_NUM_THREADS default under Slurm: SLURM_CPUS_PER_TASK when it is fewer, a bad one is named", "[env]") {
  const std::vector<std::string> slurm = {"SLURM_JOB_ID=7", "SLURM_CPUS_PER_TASK=8"};
  auto d = env::omp_threads_default(slurm, 2, 64);
  CHECK(d.threads == 4);
  CHECK(d.why == "SLURM_CPUS_PER_TASK=8");
  CHECK(env::omp_threads_default(slurm, 1, 64).threads == 8);  // one worker: the task's CPUs
  // The launcher's own affinity narrower than the task's CPUs: the affinity.
  d = env::omp_threads_default(slurm, 2, 4);
  CHECK(d.threads == 2);
  CHECK(d.why == "4 CPUs lspawn may use");
  // Not under Slurm (no SLURM_JOB_ID): the variable is someone else's.
  CHECK(env::omp_threads_default({"SLURM_CPUS_PER_TASK=8"}, 2, 64).threads == 32);
  for (const char* bad : {"", "0", "x", "-2", "8x", "99999999"}) {
    INFO("SLURM_CPUS_PER_TASK='" << bad << "'");
    try {
      env::omp_threads_default({"SLURM_JOB_ID=7", std::string("SLURM_CPUS_PER_TASK=") + bad}, 2, 64);
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(std::string("SLURM_CPUS_PER_TASK='") + bad + "'") != std::string::npos);
    }
  }
}

TEST_CASE("worker_environment: JobEnv::omp_threads sets OMP_NUM_THREADS, 0 leaves the base's", "[env]") {
  env::JobEnv job;
  auto m = as_map(env::worker_environment(job, env::WorkerPlace{0, 2, 0, 1}, {"OMP_NUM_THREADS=8"}));
  CHECK(m["OMP_NUM_THREADS"] == "8");
  m = as_map(env::worker_environment(job, env::WorkerPlace{0, 2, 0, 1}, {"A=1"}));
  CHECK(m.count("OMP_NUM_THREADS") == 0);
  job.omp_threads = 3;
  m = as_map(env::worker_environment(job, env::WorkerPlace{0, 2, 0, 1}, {"A=1"}));
  CHECK(m["OMP_NUM_THREADS"] == "3");
  m = as_map(env::worker_environment(job, env::WorkerPlace{0, 2, 0, 1}, {"OMP_NUM_THREADS=8"}));  // --omp-threads
  CHECK(m["OMP_NUM_THREADS"] == "3");
}

TEST_CASE("worker_environment: the job's secret and bind address - an inherited secret is never passed on",
          "[env][security]") {
  env::JobEnv job;
  job.master_port = 1;
  env::WorkerPlace place{0, 1, 0, 1};
  const std::vector<std::string> base{"PATH=/bin", "LSPAWN_JOB_SECRET=inherited-from-an-outer-job"};
  auto none = as_map(env::worker_environment(job, place, base));
  CHECK(none.count("LSPAWN_JOB_SECRET") == 0);
  CHECK(none.count("LSPAWN_BIND_ADDR") == 0);
  job.job_secret = "0123456789abcdef0123456789abcdef";
  job.bind_addr = "10.1.2.3";
  auto with = as_map(env::worker_environment(job, place, base));
  CHECK(with["LSPAWN_JOB_SECRET"] == job.job_secret);
  CHECK(with["LSPAWN_BIND_ADDR"] == "10.1.2.3");
}
