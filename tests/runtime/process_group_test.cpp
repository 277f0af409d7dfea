#include <chrono>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/process_group.hpp"
#include "tests/runtime/child.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using lspawn::test::Child;
using lspawn::test::ReservedPort;
using lspawn::test::TempDir;

TEST_CASE("init_process_group: gloo collectives are correct across real processes", "[process_group]") {
  const int n = GENERATE(2, 3);
  TempDir dir;
  ReservedPort reserved;
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    auto env = lspawn::test::contract_env(r, n, reserved.port(), "coll" + std::to_string(n));
    env["LSPAWN_RDZV_TIMEOUT"] = "30";
    env["LSPAWN_PG_TIMEOUT"] = "30";
    ranks.emplace_back(std::vector<std::string>{LSPAWN_TEST_WORKER, "collectives"}, env,
                       dir.file("rank" + std::to_string(r)));
  }
  for (int r = 0; r < n; ++r) {
    const auto st = ranks[r].wait(60s);
    INFO("rank " << r << "/" << n << ": " << st.describe() << "\n" << ranks[r].output());
    CHECK(st.code == 0);
    CHECK_THAT(ranks[r].output(),
               Contains("rank " + std::to_string(r) + "/" + std::to_string(n) + ": collectives ok"));
  }
}

TEST_CASE("init_process_group: a one-worker job on MASTER_PORT=0 works in-process", "[process_group]") {
  lspawn::InitOptions o;
  o.env = lspawn::WorkerEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}});
  o.backend = "gloo";
  o.timeout = 10s;
  o.rendezvous_timeout = 10s;
  lspawn::World w = lspawn::init_process_group(o);
  CHECK(w.rank() == 0);
  CHECK(w.size() == 1);
  CHECK(w.backend == "gloo");
  CHECK(w.timeout == 10s);
  // shm/auto select the collectives' transport; the world's own process group is gloo.
  for (const char* b : {"shm", "auto"}) {
    ::setenv("LSPAWN_BACKEND", b, 1);
    lspawn::InitOptions o2 = o;
    o2.backend.clear();
    CHECK(lspawn::init_process_group(o2).backend == "gloo");
  }
  ::unsetenv("LSPAWN_BACKEND");
  REQUIRE(w.peers.size() == 1);
  CHECK(w.peers[0].pid == ::getpid());
  std::vector<at::Tensor> t{at::ones({3})};
  w.pg->allreduce(t)->wait();
  CHECK(t[0].sum().item<float>() == 3.0f);
  // The store is the run's prefixed store: keys written through it are visible to the job.
  w.store->set("user/key", std::vector<uint8_t>{7});
  CHECK(w.store->get("user/key") == std::vector<uint8_t>{7});
}

TEST_CASE("init_process_group: nccl without NCCL support is a clear error", "[process_group]") {
  if (lspawn::have_nccl()) {
    SUCCEED("built with NCCL");
    return;
  }
  lspawn::InitOptions o;
  o.env = lspawn::WorkerEnv::from_map({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  o.backend = "nccl";
  CHECK_THROWS_AS(lspawn::init_process_group(o), lspawn::ProcessGroupError);
  CHECK_THROWS_WITH(lspawn::init_process_group(o),
                    Contains("rank 1/2") && Contains("lspawn was built without NCCL"));
}

TEST_CASE("init_process_group: an unknown backend names the source of the choice", "[process_group]") {
  lspawn::InitOptions o;
  o.env = lspawn::WorkerEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  ::setenv("LSPAWN_BACKEND", "mpi", 1);
  CHECK_THROWS_WITH(lspawn::init_process_group(o),
                    Contains("unknown backend 'mpi' (from LSPAWN_BACKEND): expected gloo, nccl, shm or auto"));
  ::unsetenv("LSPAWN_BACKEND");
  o.backend = "ucc";
  CHECK_THROWS_WITH(lspawn::init_process_group(o), Contains("unknown backend 'ucc' (from InitOptions::backend)"));
}

// c10's glog headers also define CHECK; if theirs won, a failing CHECK would abort the whole test
// binary instead of failing this case. [!shouldfail] turns Catch's failure into a pass.
TEST_CASE("test harness: CHECK is Catch's, not glog's", "[process_group][!shouldfail]") {
  CHECK(1 + 1 == 3);
}
