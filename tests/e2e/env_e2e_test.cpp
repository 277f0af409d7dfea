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

TEST_CASE("option --nnodes/--node-rank give global ranks - group rank and world size", "[e2e][env]") {
  auto r = run_lspawn({"--nnodes", "2", "--node-rank=1", "--nproc-per-node", "2", "--master-port", "29999",
                       "--master-addr", "10.1.2.3", worker_bin(), "env"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto env = parse_env(r.out);
  // Console prefixes carry the global rank.
  REQUIRE(env.count(2));
  REQUIRE(env.count(3));
  CHECK(env[2]["RANK"] == "2");
  CHECK(env[2]["LOCAL_RANK"] == "0");
  CHECK(env[3]["RANK"] == "3");
  CHECK(env[3]["LOCAL_RANK"] == "1");
  CHECK(env[3]["WORLD_SIZE"] == "4");
  CHECK(env[3]["LOCAL_WORLD_SIZE"] == "2");
  CHECK(env[3]["GROUP_RANK"] == "1");
  CHECK(env[3]["GROUP_WORLD_SIZE"] == "2");
  CHECK(env[3]["MASTER_ADDR"] == "10.1.2.3");
  CHECK(env[3]["MASTER_PORT"] == "29999");
}

TEST_CASE("workers inherit no fd but stdin - stdout and stderr", "[e2e][env]") {
  // Not the port reservation, the guardian socket, other workers' pipes, pidfds or the signalfd.
  auto r = run_lspawn({"--quiet", "--nprocs", "3", worker_bin(), "fds"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(count(r.out, "] fds 0 1 2\n") == 3);
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
