// Multi-node jobs on one machine: two lspawn processes on 127.0.0.1 act as two nodes (the
// network-namespace tests, tests/multinode/, do the same across two hosts). Restarts.
#include <catch2/catch.hpp>

#include <atomic>
#include <csignal>
#include <map>
#include <set>
#include <thread>

#include <poll.h>
#include <sys/wait.h>

#include "cluster/node_channel.hpp"
#include "harness.hpp"
#include "launcher/cli_options.hpp"
#include "support/loopback.hpp"
#include "supervisor/port.hpp"
#include "sys/sys.hpp"

using namespace lspawn::test;
// Every port a test names to several processes is a ReservedPort held for the test's life (bound with
// SO_REUSEADDR, not listening, as lspawn reserves MASTER_PORT): another bind(0) under ctest -j cannot take it.

namespace {

std::vector<std::string> lspawn_args(std::vector<std::string> args) {
  args.insert(args.begin(), lspawn_bin());
  return args;
}

const std::string kHost = lspawn::sys::hostname();

}  // namespace

TEST_CASE("static multi-node: two lspawns with the same --master-addr/--master-port meet without --run-id",
          "[e2e][multinode]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(r), "--nprocs", "2", "--master-addr",
                        "127.0.0.1", "--master-port", port, worker_bin(), "env"});
  };
  Child b(node(1));  // the member first: it waits for node 0
  Child a(node(0));
  const int sa = a.wait(), sb = b.wait();
  INFO(a.err() << b.err());
  REQUIRE(code_of(sa) == 0);
  REQUIRE(code_of(sb) == 0);
  auto ea = env_by_rank(a.out()), eb = env_by_rank(b.out());
  REQUIRE(ea.size() == 2);
  REQUIRE(eb.size() == 2);
  CHECK(ea.count(0) == 1);
  CHECK(ea.count(1) == 1);
  CHECK(eb.count(2) == 1);  // global ranks contiguous per node
  CHECK(eb.count(3) == 1);
  for (auto* e : {&ea, &eb}) {
    for (auto& [rank, vars] : *e) {
      CHECK(vars["WORLD_SIZE"] == "4");
      CHECK(vars["LOCAL_WORLD_SIZE"] == "2");
      CHECK(vars["GROUP_RANK"] == (rank < 2 ? "0" : "1"));
      CHECK(vars["GROUP_WORLD_SIZE"] == "2");
      CHECK(vars["ROLE_RANK"] == std::to_string(rank));
      CHECK(vars["ROLE_WORLD_SIZE"] == "4");
      CHECK(vars["LOCAL_RANK"] == std::to_string(rank % 2));
      CHECK(vars["MASTER_ADDR"] == "127.0.0.1");
      // One run id and one worker master for the job, drawn by node 0.
      CHECK(vars["TORCHELASTIC_RUN_ID"] == ea[0]["TORCHELASTIC_RUN_ID"]);
      CHECK(vars["MASTER_PORT"] == ea[0]["MASTER_PORT"]);
    }
  }
  CHECK(ea[0]["MASTER_PORT"] != port);  // node 0's lspawn listens on --master-port itself
  // Output names the host and the rank.
  CHECK(b.out().find("[" + kHost + " rank 3] RANK=3\n") != std::string::npos);
}

TEST_CASE("multi-node: --rdzv-endpoint: node ranks assigned by the rendezvous, --rdzv-id is the run id",
          "[e2e][multinode]") {
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  auto node = [&] {
    return lspawn_args({"--nnodes", "2", "--nprocs", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", ep, "--rdzv-id",
                        "job42", worker_bin(), "env"});
  };
  Child a(node());
  Child b(node());
  const int sa = a.wait(), sb = b.wait();
  INFO(a.err() << b.err());
  REQUIRE(code_of(sa) == 0);
  REQUIRE(code_of(sb) == 0);
  auto ea = env_by_rank(a.out()), eb = env_by_rank(b.out());
  std::set<int> ranks;
  std::set<std::string> groups;
  for (auto* e : {&ea, &eb}) {
    REQUIRE(e->size() == 2);
    const std::string group = e->begin()->second["GROUP_RANK"];
    groups.insert(group);
    for (auto& [rank, vars] : *e) {
      ranks.insert(rank);
      CHECK(vars["TORCHELASTIC_RUN_ID"] == "job42");
      CHECK(vars["GROUP_RANK"] == group);
      CHECK(rank / 2 == std::stoi(group));
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(groups == std::set<std::string>{"0", "1"});
}

TEST_CASE("multi-node: a rank failing on one node stops the other - both report it and exit with its code",
          "[e2e][multinode][exec-only]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  // Rank 3 (node 1) exits 7 once started; every other rank would run for a minute.
  const std::string script = "if [ $RANK = 3 ]; then sleep 0.3; echo 'rank 3 gives up' >&2; exit 7; fi; exec sleep 60";
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(r), "--nprocs", "2", "--master-port", port,
                        "--grace-period", "2", "/bin/sh", "-c", script});
  };
  Child a(node(0));
  Child b(node(1));
  const auto t0 = std::chrono::steady_clock::now();
  const int sa = a.wait(std::chrono::seconds(45)), sb = b.wait(std::chrono::seconds(45));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 7);
  CHECK(code_of(sb) == 7);
  for (const Child* c : {&a, &b}) {
    CHECK(c->err().find("lspawn: root cause: process 3 terminated with exit code 7\n") != std::string::npos);
    CHECK(c->err().find("rank 3 of 4") != std::string::npos);
    CHECK(c->err().find("on node 1 of 2") != std::string::npos);
  }
  CHECK(a.err().find("terminated by lspawn with SIGTERM") != std::string::npos);
  CHECK(secs < 30.0);  // the others were stopped, not left to their 60 s sleep
}

TEST_CASE("multi-node: a node whose lspawn is SIGKILLed is lost - the other stops in bounded time and names it",
          "[e2e][multinode][exec-only]") {
  Subreaper reaper;
  TempDir dir;
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  const std::string script = "echo $$ > " + dir.path + "/pid-$RANK; exec sleep 60";
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(r), "--nprocs", "2", "--master-port", port,
                        "--node-timeout", "2", "--grace-period", "1", "/bin/sh", "-c", script});
  };
  Child a(node(0));
  Child b(node(1));
  REQUIRE(a.wait_output(
      [](const std::string& out, const std::string& err) {
        (void)out;
        return err.find("starting 2 workers") != std::string::npos;
      },
      std::chrono::seconds(10)));
  REQUIRE(b.wait_output(
      [](const std::string&, const std::string& err) { return err.find("starting 2 workers") != std::string::npos; },
      std::chrono::seconds(10)));
  std::set<pid_t> pids;
  for (int i = 0; i < 200 && pids.size() < 4; ++i) {
    pids.clear();
    for (int r = 0; r < 4; ++r) {
      if (FILE* f = std::fopen((dir.path + "/pid-" + std::to_string(r)).c_str(), "r")) {
        int p = 0;
        if (std::fscanf(f, "%d", &p) == 1) pids.insert(p);
        std::fclose(f);
      }
    }
    if (pids.size() < 4) usleep(20000);
  }
  REQUIRE(pids.size() == 4);
  const auto t0 = std::chrono::steady_clock::now();
  b.signal(SIGKILL);
  const int sa = a.wait(std::chrono::seconds(45));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(a.err());
  CHECK(code_of(sa) == 123);
  CHECK(a.err().find("root cause: node 1 (" + kHost + ", 127.0.0.1) was lost") != std::string::npos);
  CHECK(secs < 30.0);  // stopped by the loss, not left to its workers' 60 s sleep
  // Nothing of either node is left: node 1's workers went with its lspawn (guardian).
  CHECK(alive_after(pids, std::chrono::seconds(5)).empty());
}

TEST_CASE("multi-node: a node that never comes fails the rendezvous after --rdzv-timeout", "[e2e][multinode]") {
  ReservedPort held_port;
  auto r = run_lspawn({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(held_port.port()),
                       "--rdzv-timeout", "0.5", worker_bin(), "env"});
  CHECK(r.exit_code == 122);
  CHECK(r.err.find("timed out after 0.5 s: 1/2 nodes joined") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE("multi-node: nodes that disagree on --nproc-per-node are rejected, on both sides", "[e2e][multinode]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  Child a(lspawn_args({"--nnodes", "2", "--node-rank", "0", "--nprocs", "2", "--master-port", port, "--rdzv-timeout",
                       "10", worker_bin(), "env"}));
  Child b(lspawn_args({"--nnodes", "2", "--node-rank", "1", "--nprocs", "3", "--master-port", port, "--rdzv-timeout",
                       "10", worker_bin(), "env"}));
  const int sa = a.wait(), sb = b.wait();
  INFO(a.err() << b.err());
  CHECK(code_of(sa) == 122);
  CHECK(code_of(sb) == 122);
  CHECK(b.err().find("has --nproc-per-node 3, this node 2") != std::string::npos);
}

TEST_CASE("restarts: --max-restarts 2: a rank failing on its first attempt only - the job succeeds on attempt 1",
          "[e2e][restarts][exec-only]") {
  const std::string script =
      "if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 5; fi; "
      "echo \"ok rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS "
      "run=$TORCHELASTIC_RUN_ID\"";
  auto r = run_lspawn({"--nprocs", "2", "--max-restarts", "2", "--run-id", "r1", "/bin/sh", "-c", script});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[rank 0] ok rank=0 restart=1 max=2 run=r1\n") != std::string::npos);
  CHECK(r.out.find("[rank 1] ok rank=1 restart=1 max=2 run=r1\n") != std::string::npos);
  CHECK(count(r.out, "ok rank=1") == 1);  // rank 1 printed only on attempt 1
  CHECK(r.err.find("attempt 0 failed; restarting") != std::string::npos);
  CHECK(r.err.find("process 1 terminated with exit code 5") != std::string::npos);
}

TEST_CASE("restarts: --max-restarts 1: a rank failing every time - the last attempt's root cause is reported",
          "[e2e][restarts][exec-only]") {
  auto r = run_lspawn({"--nprocs", "2", "--max-restarts", "1", "/bin/sh", "-c",
                       "if [ $RANK = 0 ]; then exit $((10 + TORCHELASTIC_RESTART_COUNT)); fi; exec sleep 30"});
  INFO(r.err);
  CHECK(r.exit_code == 11);
  CHECK(r.err.find("lspawn: root cause: process 0 terminated with exit code 11\n") != std::string::npos);
  CHECK(r.seconds < 15.0);  // rank 1 (sleep 30) was stopped, not waited for
}

TEST_CASE("restarts: --no-restart-exit-codes - a usage error is not retried K times, other codes are",
          "[e2e][restarts][exec-only]") {
  // Exit 2 (a script's usage error) on every attempt: one attempt, and the report says why.
  auto r = run_lspawn({"--nprocs", "2", "--max-restarts", "3", "--no-restart-exit-codes", "2,3", "/bin/sh", "-c",
                       "echo attempt $TORCHELASTIC_RESTART_COUNT; if [ $RANK = 0 ]; then exit 2; fi; exec sleep 30"});
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(count(r.out, "] attempt 0") >= 1);
  CHECK(r.out.find("attempt 1") == std::string::npos);
  CHECK(r.err.find("lspawn: root cause: process 0 terminated with exit code 2\n") != std::string::npos);
  CHECK(r.err.find("lspawn:   not restarted (3 restarts left): exit code 2 is one of --no-restart-exit-codes 2,3\n") !=
        std::string::npos);
  CHECK(r.seconds < 15.0);
  // Another code is retried as before.
  r = run_lspawn({"--nprocs", "1", "--max-restarts", "1", "--no-restart-exit-codes", "2,3", "/bin/sh", "-c",
                  "echo attempt $TORCHELASTIC_RESTART_COUNT; exit 4"});
  CHECK(r.exit_code == 4);
  CHECK(r.out.find("attempt 1") != std::string::npos);
  CHECK(r.err.find("not restarted") == std::string::npos);
}

TEST_CASE("restarts: --max-restarts across two nodes: both restart and succeed on attempt 1",
          "[e2e][restarts][multinode][exec-only]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  const std::string script =
      "if [ $RANK = 2 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 5; fi; "
      "[ $TORCHELASTIC_RESTART_COUNT = 0 ] && exec sleep 30; echo \"ok rank=$RANK "
      "restart=$TORCHELASTIC_RESTART_COUNT\"";
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(r), "--nprocs", "2", "--master-port", port,
                        "--max-restarts", "2", "/bin/sh", "-c", script});
  };
  Child a(node(0));
  Child b(node(1));
  const int sa = a.wait(), sb = b.wait();
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  CHECK(a.out().find("rank 0] ok rank=0 restart=1\n") != std::string::npos);
  CHECK(b.out().find("rank 3] ok rank=3 restart=1\n") != std::string::npos);
  // Both say why: the coordinator decides, the other node is told.
  CHECK(a.err().find("attempt 0 failed; restarting every node's workers (restart 1 of at most 2)") !=
        std::string::npos);
  CHECK(b.err().find("attempt 0 failed (process 2 terminated with exit code 5 on node 1 (" + kHost +
                     ")); the coordinator restarts every node's workers") != std::string::npos);
  CHECK(b.err().find("restart 1 of 2: starting 2 workers") != std::string::npos);
}

namespace {
// Both "nodes" running `sleep 60` workers, started and seen running.
struct TwoNodes {
  ReservedPort held_port;
  std::string port = std::to_string(held_port.port());
  std::unique_ptr<Child> a, b;
  explicit TwoNodes(const std::vector<std::string>& extra = {}) {
    auto node = [&](int r) {
      std::vector<std::string> args{"--nnodes",       "2", "--node-rank",   std::to_string(r),
                                    "--nprocs",       "2", "--master-port", port,
                                    "--grace-period", "1"};
      args.insert(args.end(), extra.begin(), extra.end());
      args.insert(args.end(), {"/bin/sh", "-c", "echo up; exec sleep 60"});
      return lspawn_args(args);
    };
    a = std::make_unique<Child>(node(0));
    b = std::make_unique<Child>(node(1));
    for (Child* c : {a.get(), b.get()}) {
      REQUIRE(c->wait_stdout_count("] up\n", 2, std::chrono::seconds(10)));
    }
  }
};
}  // namespace

TEST_CASE("multi-node: the coordinator's lspawn SIGKILLed: the other node names node 0 as lost",
          "[e2e][multinode][exec-only]") {
  Subreaper reaper;
  TwoNodes job({"--node-timeout", "2"});
  job.a->signal(SIGKILL);
  const int sb = job.b->wait(std::chrono::seconds(15));
  INFO(job.b->err());
  CHECK(code_of(sb) == 123);
  // The kernel closes a killed process's sockets: a FIN, or a reset when bytes it had not read
  // were pending (a slow node, e.g. under ThreadSanitizer) — both name the node as lost.
  const std::string lost = "root cause: node 0 (" + kHost + ", 127.0.0.1) was lost: connection ";
  CHECK((job.b->err().find(lost + "closed") != std::string::npos ||
         job.b->err().find(lost + "broken (Connection reset by peer)") != std::string::npos));
}

TEST_CASE("multi-node: SIGTERM to one lspawn stops the whole job - both exit 143 and name it",
          "[e2e][multinode][exec-only]") {
  TwoNodes job;
  job.b->signal(SIGTERM);
  const int sa = job.a->wait(std::chrono::seconds(15)), sb = job.b->wait(std::chrono::seconds(15));
  INFO(job.a->err() << "----\n" << job.b->err());
  CHECK(code_of(sa) == 143);
  CHECK(code_of(sb) == 143);
  for (Child* c : {job.a.get(), job.b.get()}) {
    CHECK(c->err().find("root cause: lspawn on node 1 (" + kHost + ") received SIGTERM") != std::string::npos);
  }
}

TEST_CASE("multi-node: waiting for a late node is not silence: nodes that joined early are not lost",
          "[e2e][multinode][exec-only]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "3", "--node-rank", std::to_string(r), "--master-port", port, "--node-timeout", "2",
                        "/bin/sh", "-c", "sleep 2.5"});
  };
  // A node timeout a loaded machine cannot miss by accident (its heartbeats are well within
  // 2 s), and waits and runs longer than it.
  Child a(node(0));
  Child b(node(1));
  usleep(3000 * 1000);  // nodes 0 and 1 wait 3 s (> node timeout) for node 2
  Child c(node(2));
  const int sa = a.wait(), sb = b.wait(), sc = c.wait();
  INFO(a.err() << "----\n" << b.err() << "----\n" << c.err());
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  CHECK(code_of(sc) == 0);
}

TEST_CASE("multi-node: the earliest failure wins even if its rank was still unwinding when another node's failed",
          "[e2e][multinode][exec-only]") {
  // Rank 3 (node 1) reports an error and is still exiting when rank 0 (node 0) exits 9: the
  // job's root cause is rank 3 on both nodes (its report is earlier), as on one node.
  TempDir sync;
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  const std::string script = "if [ $RANK = 3 ]; then exec " + worker_bin() +
                             " report-then-wait 3; fi; if [ $RANK = 0 ]; then until [ -e " + sync.path +
                             "/ready-3 ]; do sleep 0.01; done; exit 9; fi; exec sleep 60";
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(r), "--nprocs", "2", "--master-port", port,
                        "--grace-period", "2", "/bin/sh", "-c", script});
  };
  Child a(node(0), {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  Child b(node(1), {"LSPAWN_TEST_SYNC_DIR=" + sync.path});
  const int sa = a.wait(), sb = b.wait();
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 1);
  CHECK(code_of(sb) == 1);
  for (const Child* c : {&a, &b}) {
    CHECK(c->err().find("lspawn: root cause: process 3 raised std::runtime_error and was stopped by lspawn") !=
          std::string::npos);
    CHECK(c->err().find("error: std::runtime_error: first failure") != std::string::npos);
  }
  CHECK(a.err().find("lspawn: also process 0 terminated with exit code 9") != std::string::npos);
}

TEST_CASE("multi-node: node 0 must listen on --master-addr: an address of another host is a usage error",
          "[e2e][multinode]") {
  ReservedPort held_port;
  auto r = run_lspawn({"--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.1", "--master-port",
                       std::to_string(held_port.port()), worker_bin(), "env"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("192.0.2.1:") != std::string::npos);
  CHECK(r.err.find("is not an address of this host") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE(
    "multi-node: --rdzv-endpoint with given node ranks: the host of the endpoint may be node 1 - node 0 hosts the "
    "workers' store",
    "[e2e][multinode]") {
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--nprocs", "2", "--node-rank", std::to_string(r), "--rdzv-endpoint", ep,
                        worker_bin(), "env"});
  };
  Child host(node(1));  // binds the endpoint first: the coordinator, as node 1
  REQUIRE(host.wait_output(
      [](const std::string&, const std::string& err) {
        return err.find("rendezvous: waiting for 1 more node") != std::string::npos;
      },
      std::chrono::seconds(10)));
  Child zero(node(0));
  const int sh = host.wait(), sz = zero.wait();
  INFO(host.err() << "----\n" << zero.err());
  REQUIRE(code_of(sh) == 0);
  REQUIRE(code_of(sz) == 0);
  auto eh = env_by_rank(host.out()), ez = env_by_rank(zero.out());
  CHECK(ez.count(0) == 1);
  CHECK(ez.count(1) == 1);
  CHECK(eh.count(2) == 1);
  CHECK(eh.count(3) == 1);
  // MASTER_PORT: the port node 0 reserved on its own address, the same for every rank.
  CHECK(eh[2]["MASTER_PORT"] == ez[0]["MASTER_PORT"]);
  CHECK(eh[2]["MASTER_ADDR"] == "127.0.0.1");
  CHECK(ez[0]["MASTER_PORT"] != ep.substr(ep.find(':') + 1));
}

TEST_CASE("multi-node: --rdzv-endpoint with the same --node-rank twice is rejected", "[e2e][multinode]") {
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  auto node = [&] {
    return lspawn_args(
        {"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", ep, "--rdzv-timeout", "10", worker_bin(), "env"});
  };
  Child a(node());
  REQUIRE(a.wait_output(
      [](const std::string&, const std::string& err) {
        return err.find("rendezvous: waiting for 1 more node") != std::string::npos;
      },
      std::chrono::seconds(10)));
  Child b(node());
  const int sa = a.wait(), sb = b.wait();
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 122);
  CHECK(code_of(sb) == 122);
  CHECK(b.err().find("both have --node-rank 1") != std::string::npos);
}

TEST_CASE(
    "multi-node hang: the coordinator's watch covers every node - a rank of node 1 that never enters is named "
    "with its stack on both nodes, both exit 124",
    "[e2e][multinode][hang][exec-only]") {
  Subreaper reaper;
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  auto node = [&](int r) {
    return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(r), "--nprocs", "2", "--master-addr",
                        "127.0.0.1", "--master-port", port, "--hang-timeout", "1", "--grace-period", "2",
                        hang_worker_bin(), "never-enters", "3", "3"});
  };
  Child b(node(1));
  Child a(node(0));
  const int sa = a.wait(std::chrono::seconds(60)), sb = b.wait(std::chrono::seconds(60));
  INFO(a.err() << "\n=====\n" << b.err());
  CHECK(code_of(sa) == lspawn::exit_codes::kHang);
  CHECK(code_of(sb) == lspawn::exit_codes::kHang);
  for (const std::string* e : {&a.err(), &b.err()}) {
    // Ranks 0-2 wait (two of them on node 0, one on node 1), rank 3 on node 1 is behind.
    CHECK(count(*e, "lspawn: hang: no rank made progress in its collectives for ") == 1);
    CHECK_THAT(*e, Catch::Matchers::Contains("waiting: ranks 0-2 in all_reduce #4 on group world, 16 B, for "));
    CHECK_THAT(*e, Catch::Matchers::Contains("(3 of 4 members)"));
    CHECK_THAT(*e, Catch::Matchers::Contains("behind: rank 3 on " + kHost + " has not entered a collective for "));
    CHECK_THAT(*e, Catch::Matchers::Contains("main thread of rank 3 (pid "));
    CHECK_THAT(*e, Catch::Matchers::Contains("lspawn_test::sleep_outside_collectives()"));  // asked of node 1's lspawn
    CHECK_THAT(*e, Catch::Matchers::Contains("root cause: no rank made progress in its collectives for 1 s on node 0"));
  }
}

TEST_CASE("multi-node: --local-addr is the address node 0 advertises for the workers' store (as torchrun)",
          "[e2e][multinode][torchrun]") {
  // 127.0.0.2 and 127.0.0.3 are this host's too (loopback is 127/8), distinct from the endpoint's.
  for (const bool host_is_zero : {false, true}) {
    ReservedPort held_ep;
    const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
    const std::string addr = host_is_zero ? "127.0.0.3" : "127.0.0.2";
    auto node = [&](int r) {
      std::vector<std::string> a = {"--nnodes",        "2", "--nprocs", "1", "--node-rank", std::to_string(r),
                                    "--rdzv-endpoint", ep};
      if (r == 0) a.insert(a.end(), {"--local_addr", addr});
      a.insert(a.end(), {worker_bin(), "env"});
      return lspawn_args(a);
    };
    const int first = host_is_zero ? 0 : 1;  // binds the endpoint: the coordinator
    Child host(node(first));
    REQUIRE(host.wait_output(
        [](const std::string&, const std::string& err) {
          return err.find("rendezvous: waiting for 1 more node") != std::string::npos;
        },
        std::chrono::seconds(10)));
    Child other(node(1 - first));
    const int sh = host.wait(), so = other.wait();
    INFO("host is node 0: " << host_is_zero << "\n" << host.err() << "----\n" << other.err());
    REQUIRE(code_of(sh) == 0);
    REQUIRE(code_of(so) == 0);
    auto eh = env_by_rank(host.out()), eo = env_by_rank(other.out());
    CHECK(eh[host_is_zero ? 0 : 1]["MASTER_ADDR"] == addr);
    CHECK(eo[host_is_zero ? 1 : 0]["MASTER_ADDR"] == addr);
  }
}

// Elastic jobs: --nnodes MIN:MAX with --rdzv-endpoint (docs/multi-node.md "Elastic jobs").
// Three lspawns on 127.0.0.1 as three nodes; round 0's workers wait, a later round's run
// real collectives (the hang fixture's slow-steps: an all_reduce over the whole world, then
// "ready pid", exit 0), so a world that came out wrong would not finish.
namespace {

struct ElasticNode {
  std::unique_ptr<Child> child;
  bool stdout_has(const std::string& s) const { return child->out().find(s) != std::string::npos; }
  bool stderr_has(const std::string& s) const { return child->err().find(s) != std::string::npos; }
};

// `lspawn --nnodes RANGE --nprocs 2 --rdzv-endpoint EP ...`: round 0 prints "up RANK/WORLD"
// and sleeps (round0 "stay") or exits 0 at once (round0 "exit"); later rounds print
// "round R: RANK/WORLD group G" and all_reduce on the world.
std::vector<std::string> elastic_node(const std::string& range, const std::string& ep,
                                      const std::vector<std::string>& extra, const std::string& round0 = "stay") {
  const std::string later = "echo \"round $TORCHELASTIC_RESTART_COUNT: $RANK/$WORLD_SIZE group $GROUP_RANK\"; exec " +
                            hang_worker_bin() + " slow-steps 0 1";
  const std::string first =
      round0 == "stay" ? "echo \"up $RANK/$WORLD_SIZE\"; exec sleep 60" : "echo \"up $RANK/$WORLD_SIZE\"; exit 0";
  std::vector<std::string> args{"--nnodes",       range, "--nprocs",       "2", "--rdzv-endpoint", ep,
                                "--node-timeout", "3",   "--grace-period", "1", "--rdzv-timeout",  "60"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(),
              {"/bin/sh", "-c", "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then " + first + "; fi; " + later});
  return lspawn_args(args);
}

bool wait_err(Child& c, const std::string& needle, std::chrono::seconds limit = std::chrono::seconds(30)) {
  return c.wait_output(
      [&](const std::string&, const std::string& err) { return err.find(needle) != std::string::npos; }, limit);
}

}  // namespace

TEST_CASE("elastic: --nnodes 2:3, a node lost - the 2 others go on as a world of 4 and its collectives work",
          "[e2e][multinode][elastic][exec-only]") {
  Subreaper reaper;
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  const std::vector<std::string> extra{"--max-restarts", "1"};
  Child a(elastic_node("2:3", ep, extra));
  REQUIRE(wait_err(a, "rendezvous: waiting for 1 to 2 more nodes on " + ep + " (--nnodes 2:3"));
  Child b(elastic_node("2:3", ep, extra));
  REQUIRE(wait_err(a, "rendezvous: 2 nodes joined (--nnodes 2:3): waiting 30 s for more (last_call_timeout)"));
  Child c(elastic_node("2:3", ep, extra));  // the third: MAX, the rendezvous closes at once
  for (Child* n : {&a, &b, &c}) REQUIRE(n->wait_stdout_count("/6\n", 2, std::chrono::seconds(30)));
  INFO(a.err() << "----\n" << b.err() << "----\n" << c.err());
  CHECK(a.err().find("rendezvous: 3 nodes joined after") != std::string::npos);
  CHECK(c.out().find("rank 5] up 5/6\n") != std::string::npos);  // join order: node 2
  c.signal(SIGKILL);
  const int sa = a.wait(std::chrono::seconds(60)), sb = b.wait(std::chrono::seconds(60));
  INFO(a.out() << "----\n" << b.out());
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  // The coordinator names the lost node and restarts the survivors, a restart of --max-restarts.
  CHECK(a.err().find("root cause: node 2 (" + kHost + ", 127.0.0.1) was lost: connection closed") != std::string::npos);
  CHECK(a.err().find(
            "attempt 0 failed; restarting the 2 remaining nodes' workers (--nnodes 2:3, restart 1 of at most 1)") !=
        std::string::npos);
  CHECK(a.err().find("restart 1 of 1: starting 2 workers (node 0 of 2)") != std::string::npos);
  CHECK(b.err().find("the coordinator restarts the workers of the 2 remaining nodes") != std::string::npos);
  CHECK(b.err().find("restart 1 of 1: starting 2 workers (node 1 of 2)") != std::string::npos);
  // Round 1: ranks 0..3 of a world of 4, node ranks 0 and 1; each rank's all_reduce finished.
  for (int r = 0; r < 4; ++r) {
    const Child& n = r < 2 ? a : b;
    CHECK(n.out().find("rank " + std::to_string(r) + "] round 1: " + std::to_string(r) + "/4 group " +
                       std::to_string(r / 2) + "\n") != std::string::npos);
  }
  CHECK(a.wait_stdout_count("] ready pid ", 2, std::chrono::seconds(1)));
  CHECK(b.wait_stdout_count("] ready pid ", 2, std::chrono::seconds(1)));
}

TEST_CASE(
    "elastic: --nnodes 2:3 formed with 2 after the last call - a third that joins later is admitted "
    "in a new round, which is not a restart",
    "[e2e][multinode][elastic][exec-only]") {
  Subreaper reaper;
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  // --max-restarts 0: admitting a node must not need a restart.
  const std::vector<std::string> extra{"--max-restarts", "0", "--rdzv-conf", "last_call_timeout=0.5"};
  Child a(elastic_node("2:3", ep, extra));
  REQUIRE(wait_err(a, "rendezvous: waiting for 1 to 2 more nodes"));
  Child b(elastic_node("2:3", ep, extra));
  for (Child* n : {&a, &b}) REQUIRE(n->wait_stdout_count("/4\n", 2, std::chrono::seconds(30)));
  CHECK(a.err().find("rendezvous: 2 nodes joined after") != std::string::npos);
  Child c(elastic_node("2:3", ep, extra));
  const int sa = a.wait(std::chrono::seconds(60)), sb = b.wait(std::chrono::seconds(60)),
            sc = c.wait(std::chrono::seconds(60));
  INFO(a.err() << "----\n" << b.err() << "----\n" << c.err() << "----\n" << a.out() << b.out() << c.out());
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  CHECK(code_of(sc) == 0);
  CHECK(a.err().find("stopping the workers of every node: a new node, " + kHost +
                     " (127.0.0.1), joined the job "
                     "(--nnodes 2:3): the next round admits it") != std::string::npos);
  CHECK(a.err().find("round 1: starting 2 workers (node 0 of 3)") != std::string::npos);
  CHECK(b.err().find("the coordinator starts round 1 with 3 nodes") != std::string::npos);
  CHECK(b.err().find("round 1: starting 2 workers (node 1 of 3)") != std::string::npos);
  CHECK(c.err().find("rendezvous: node 2 of 3 after") != std::string::npos);
  CHECK(a.err().find("restart") == std::string::npos);  // no restart was used
  CHECK(c.out().find("] up ") == std::string::npos);    // the new node starts in round 1
  for (int r = 0; r < 6; ++r) {
    const Child& n = r < 2 ? a : r < 4 ? b : c;
    CHECK(n.out().find("rank " + std::to_string(r) + "] round 1: " + std::to_string(r) + "/6 group " +
                       std::to_string(r / 2) + "\n") != std::string::npos);
  }
  for (Child* n : {&a, &b, &c}) CHECK(n->wait_stdout_count("] ready pid ", 2, std::chrono::seconds(1)));
}

TEST_CASE("elastic: --nnodes 2:3 down to 1 node - fewer than MIN: the job ends with the lost node as root cause",
          "[e2e][multinode][elastic][exec-only]") {
  Subreaper reaper;
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  const std::vector<std::string> extra{"--max-restarts", "3", "--rdzv-conf", "last_call_timeout=0.3"};
  Child a(elastic_node("2:3", ep, extra));
  REQUIRE(wait_err(a, "rendezvous: waiting for 1 to 2 more nodes"));
  Child b(elastic_node("2:3", ep, extra));
  for (Child* n : {&a, &b}) REQUIRE(n->wait_stdout_count("/4\n", 2, std::chrono::seconds(30)));
  b.signal(SIGKILL);
  const int sa = a.wait(std::chrono::seconds(30));
  INFO(a.err());
  CHECK(code_of(sa) == 123);
  CHECK(a.err().find("root cause: node 1 (" + kHost +
                     ", 127.0.0.1) was lost: connection closed\n"
                     "lspawn:   1 node left, fewer than the 2 of --nnodes 2:3\n") != std::string::npos);
  CHECK(a.err().find("restart") == std::string::npos);
}

TEST_CASE(
    "elastic: nodes that cannot join a running job are turned away without disturbing it "
    "(another --nproc-per-node, the job at MAX, the job over before the next round)",
    "[e2e][multinode][elastic][exec-only]") {
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  const std::vector<std::string> extra{"--rdzv-conf", "last_call_timeout=0.3"};
  // Node 0's workers exit 0 at once; node 1's exit after 4 s: the job succeeds in round 0.
  auto node = [&](const std::string& range, const std::string& nprocs, const std::string& script) {
    return lspawn_args({"--nnodes", range, "--nprocs", nprocs, "--rdzv-endpoint", ep, "--rdzv-timeout", "30",
                        "--rdzv-conf", "last_call_timeout=0.3", "/bin/sh", "-c", script});
  };
  const std::string script = "echo \"up $RANK/$WORLD_SIZE\"; [ $GROUP_RANK = 0 ] || sleep 4";
  SECTION("another --nproc-per-node, then the job at MAX") {
    Child a(node("1:2", "2", script));
    REQUIRE(wait_err(a, "rendezvous: waiting for 0 to 1 more nodes"));
    Child b(node("1:2", "2", script));
    REQUIRE(b.wait_stdout_count("/4\n", 2, std::chrono::seconds(30)));
    // Not an lspawn: bytes that are no frame of the channel's.
    if (const int fd = connect_to(static_cast<uint16_t>(std::stoi(ep.substr(ep.rfind(':') + 1)))); fd >= 0) {
      (void)!::send(fd, "\x7f\xff\xff\xffjunk", 8, MSG_NOSIGNAL);
      usleep(100 * 1000);
      ::close(fd);
    }
    Child c(node("1:2", "3", script));
    Child d(node("1:2", "2", script));
    const int sc = c.wait(std::chrono::seconds(30)), sd = d.wait(std::chrono::seconds(30));
    const int sa = a.wait(std::chrono::seconds(30)), sb = b.wait(std::chrono::seconds(30));
    INFO(a.err() << "----\n" << b.err() << "----\n" << c.err() << "----\n" << d.err());
    CHECK(code_of(sc) == 122);
    CHECK(c.err().find("has --nproc-per-node 3, this node 2") != std::string::npos);
    CHECK(code_of(sd) == 122);
    CHECK(d.err().find("cannot join: the job has its --nnodes 1:2 maximum of 2 nodes") != std::string::npos);
    CHECK(code_of(sa) == 0);
    CHECK(code_of(sb) == 0);
    CHECK(a.err().find("rejected connection from 127.0.0.1:") != std::string::npos);
    CHECK(a.err().find("bad frame: length 2147483647 exceeds") != std::string::npos);
    CHECK(a.err().find("round 1") == std::string::npos);  // the job was not stopped
    CHECK(d.out().empty());
  }
  SECTION("a node that comes when some node's workers are done waits, and is turned away when the job ends") {
    Child a(node("2:3", "2", script));
    REQUIRE(wait_err(a, "rendezvous: waiting for 1 to 2 more nodes"));
    Child b(node("2:3", "2", script));
    REQUIRE(b.wait_stdout_count("/4\n", 2, std::chrono::seconds(30)));
    REQUIRE(a.wait_stdout_count("/4\n", 2, std::chrono::seconds(30)));
    // Node 0's workers exit at once: wait for the coordinator to have seen them end.
    usleep(500 * 1000);
    Child c(node("2:3", "2", script));
    const int sa = a.wait(std::chrono::seconds(30)), sb = b.wait(std::chrono::seconds(30));
    const int sc = c.wait(std::chrono::seconds(30));
    INFO(a.err() << "----\n" << b.err() << "----\n" << c.err());
    CHECK(code_of(sa) == 0);
    CHECK(code_of(sb) == 0);
    CHECK(a.err().find("wants to join: it is admitted if the job goes on to a next round") != std::string::npos);
    CHECK(code_of(sc) == 122);
    CHECK(c.err().find("the job ended (exit code 0) before this node could join") != std::string::npos);
    CHECK(c.out().empty());
  }
}

namespace {
// Waits up to `limit` for the peer to close `fd` (recv returns 0 or an error): true when it did.
bool closed_by_peer(int fd, std::chrono::seconds limit) {
  timeval tv{static_cast<time_t>(limit.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  const ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}
size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("elastic: connections that send no join message are closed after --node-timeout - at most 64 wait at once",
          "[e2e][multinode][elastic][exec-only]") {
  ReservedPort held_port;
  const uint16_t port = held_port.port();
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  // One node, --nnodes 1:2: the job forms after the last call (2 s) and its worker runs 5 s.
  Child a(lspawn_args({"--nnodes", "1:2", "--nprocs", "1", "--rdzv-endpoint", ep, "--node-timeout", "1", "--rdzv-conf",
                       "last_call_timeout=2", "/bin/sh", "-c", "echo up; sleep 5"}));
  REQUIRE(wait_err(a, "rendezvous: waiting for 0 to 1 more nodes on " + ep));
  // Before the job forms: a silent connection is closed after 1 s, the rendezvous goes on.
  const int early = connect_to(port);
  REQUIRE(early >= 0);
  CHECK(closed_by_peer(early, std::chrono::seconds(10)));
  ::close(early);
  REQUIRE(a.wait_stdout_count("] up\n", 1, std::chrono::seconds(30)));
  // The job runs: 64 silent connections are held (each for 1 s), the 65th is closed at once.
  std::vector<int> fds;
  for (int i = 0; i < 65; ++i) {
    const int fd = connect_to(port);
    REQUIRE(fd >= 0);
    fds.push_back(fd);
  }
  CHECK(wait_err(a,
                 "64 connections have not sent a join message yet, the most there may be (further ones are closed "
                 "without a word)"));
  for (int fd : fds) {
    CHECK(closed_by_peer(fd, std::chrono::seconds(10)));
    ::close(fd);
  }
  const int sa = a.wait(std::chrono::seconds(30));
  INFO(a.err());
  CHECK(code_of(sa) == 0);  // the job was not disturbed
  CHECK(a.err().find("round 1") == std::string::npos);
  const std::string overdue = ": no join message within 1 s (--node-timeout)\n";
  CHECK(count_of(a.err(), overdue) == 65);                           // the early one and the 64 held
  CHECK(a.err().find(overdue) < a.err().find("starting 1 worker"));  // the early one, at the rendezvous
}

TEST_CASE("elastic: fewer than MIN nodes by --rdzv-timeout - the rendezvous fails and says how many came",
          "[e2e][multinode][elastic]") {
  ReservedPort held_ep;
  auto r = run_lspawn({"--nnodes", "2:3", "--rdzv-endpoint", "127.0.0.1:" + std::to_string(held_ep.port()),
                       "--rdzv-timeout", "0.5", worker_bin(), "env"});
  CHECK(r.exit_code == 122);
  CHECK(r.err.find("timed out after 0.5 s: 1/2 nodes joined (--nnodes 2:3)") != std::string::npos);
  CHECK(r.out.empty());
}

namespace {
// A port taken by the test (LoopbackListener: no SO_REUSEADDR, so lspawn cannot bind it):
// listening, the kernel completes every connection and nothing is ever sent back (a silent
// stranger); not listening, a connection is refused.
using lspawn::test::LoopbackListener;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("rendezvous: a silent listener on the endpoint - said within seconds, named by the timeout",
          "[e2e][multinode][elastic]") {
  LoopbackListener taken;
  const std::string ep = "127.0.0.1:" + taken.port_text();
  const auto t0 = std::chrono::steady_clock::now();
  Child a(lspawn_args({"--nnodes", "2:3", "--rdzv-endpoint", ep, "--rdzv-timeout", "10", worker_bin(), "env"}));
  const std::string silent = ep + " accepted the connection but sent nothing lspawn understands in ";
  // Said within a few seconds (3 s after it began), not at the timeout.
  CHECK(wait_err(
      a, "rendezvous on " + ep + ": this node could not host it (bind: Address already in use) nor join it: " + silent,
      std::chrono::seconds(6)));
  CHECK(seconds_since(t0) < 6.0);
  const int sa = a.wait(std::chrono::seconds(30));
  INFO(a.err());
  CHECK(code_of(sa) == 122);
  CHECK(seconds_since(t0) >= 10.0);
  CHECK(has(a.err(), "rendezvous on " + ep +
                         " timed out after 10 s: this node could not host it (bind: Address "
                         "already in use) nor join it: " +
                         silent));
  CHECK(count(a.err(), "; still trying (") >= 2);  // said again while it waited (at 3 s, 8 s)
  CHECK_FALSE(has(a.err(), "waiting for the other nodes"));
  CHECK(a.out().empty());
}

TEST_CASE("rendezvous: the endpoint taken by a socket that does not listen - bind and connect both named",
          "[e2e][multinode]") {
  LoopbackListener taken(LoopbackListener::kNotListening);
  const std::string ep = "127.0.0.1:" + taken.port_text();
  const auto t0 = std::chrono::steady_clock::now();
  Child a(lspawn_args({"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-timeout", "5", worker_bin(), "env"}));
  const std::string why =
      "this node could not host it (bind: Address already in use) nor join it: connect: Connection refused";
  CHECK(wait_err(a, "rendezvous on " + ep + ": " + why + "; still trying (", std::chrono::seconds(5)));
  CHECK(seconds_since(t0) < 5.0);
  const int sa = a.wait(std::chrono::seconds(30));
  INFO(a.err());
  CHECK(code_of(sa) == 122);
  CHECK(has(a.err(), "rendezvous on " + ep + " timed out after 5 s: " + why));
  CHECK(a.out().empty());
}

TEST_CASE("rendezvous: a static member whose node 0 is a silent stranger says so, then names it at the timeout",
          "[e2e][multinode]") {
  LoopbackListener taken;
  const std::string ep = "127.0.0.1:" + taken.port_text();
  Child b(lspawn_args({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                       taken.port_text(), "--rdzv-timeout", "4", worker_bin(), "env"}));
  const std::string why =
      "node 0 could not be reached: " + ep + " accepted the connection but sent nothing lspawn understands in ";
  CHECK(wait_err(b, "rendezvous on " + ep + ": " + why, std::chrono::seconds(4)));
  const int sb = b.wait(std::chrono::seconds(30));
  INFO(b.err());
  CHECK(code_of(sb) == 122);
  CHECK(has(b.err(), "rendezvous on " + ep + " timed out after 4 s: " + why + "4 s"));
}

TEST_CASE("rendezvous: another protocol answering on the endpoint - named, and tried again", "[e2e][multinode]") {
  LoopbackListener taken;
  std::atomic<int> answered{0};
  std::atomic<bool> done{false};
  std::thread answerer([&] {  // reads what comes, answers as an HTTP server would, closes
    while (!done) {
      pollfd p{taken.fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept4(taken.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      char buf[4096];
      pollfd q{c, POLLIN, 0};
      if (::poll(&q, 1, 1000) > 0) (void)!::read(c, buf, sizeof buf);
      const char reply[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
      (void)!::write(c, reply, sizeof reply - 1);
      ::close(c);
      ++answered;
    }
  });
  const std::string ep = "127.0.0.1:" + taken.port_text();
  auto r = run_lspawn({"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-timeout", "4", worker_bin(), "env"});
  done = true;
  answerer.join();
  INFO(r.err);
  CHECK(r.exit_code == 122);
  const std::string why = "this node could not host it (bind: Address already in use) nor join it: " + ep +
                          " answered with bytes that are no lspawn message (bad frame: length 1213486160 exceeds";
  CHECK(has(r.err, "rendezvous on " + ep + ": " + why));  // said while it tried again
  CHECK(has(r.err, "rendezvous on " + ep + " timed out after 4 s: " + why));
  CHECK(answered > 1);  // it did try again
}

TEST_CASE("rendezvous: nodes that could neither host nor join try hosting again - freed, the endpoint gets a host",
          "[e2e][multinode]") {
  LoopbackListener taken(LoopbackListener::kNotListening);
  const std::string ep = "127.0.0.1:" + taken.port_text();
  auto node = [&] {
    return lspawn_args(
        {"--nnodes", "2", "--nprocs", "1", "--rdzv-endpoint", ep, "--rdzv-timeout", "30", worker_bin(), "env"});
  };
  Child a(node());
  Child b(node());
  const std::string refused = "nor join it: connect: Connection refused; still trying (";
  REQUIRE(wait_err(a, refused, std::chrono::seconds(10)));
  REQUIRE(wait_err(b, refused, std::chrono::seconds(10)));
  taken.close();  // the port is free: the next try of one of them binds it
  const int sa = a.wait(std::chrono::seconds(30)), sb = b.wait(std::chrono::seconds(30));
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  CHECK(count(a.err() + b.err(), "rendezvous: waiting for 1 more node on " + ep) == 1);  // one host
  CHECK(env_by_rank(a.out()).size() + env_by_rank(b.out()).size() == 2);
}

// The channel's messages are proto's (proto/node_messages.hpp); a node of another protocol version
// is still read far enough to be refused by its version, on both sides.
TEST_CASE("multi-node: a node of another control protocol version is refused, both versions named",
          "[e2e][multinode]") {
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  Child a(lspawn_args({"--nnodes", "2", "--node-rank", "0", "--nprocs", "1", "--master-addr", "127.0.0.1",
                       "--master-port", port, "--rdzv-timeout", "20", worker_bin(), "env"}));
  int fd = -1;
  for (int i = 0; i < 200 && fd < 0; ++i) {
    fd = connect_to(held_port.port());
    if (fd < 0) usleep(50 * 1000);
  }
  REQUIRE(fd >= 0);
  lspawn::node::JoinMsg j;
  j.version = lspawn::node::kProtocolVersion + 1;
  j.host = "lsp-future";
  j.node_rank = 1;
  j.nnodes = 2;
  j.nproc_per_node = 1;
  const std::string frame = lspawn::node::encode("join", j);
  REQUIRE(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  std::string got;  // what the coordinator answers, up to its close
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) <= 0) break;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const int sa = a.wait(std::chrono::seconds(30));
  INFO(a.err());
  const std::string why = "(lsp-future) speaks control protocol " + std::to_string(lspawn::node::kProtocolVersion + 1) +
                          ", this lspawn " + std::to_string(lspawn::node::kProtocolVersion);
  CHECK(code_of(sa) == 122);
  CHECK(a.err().find(why) != std::string::npos);
  // The member is told why: a "reject" frame naming both versions.
  std::string reason;
  size_t pos = 0;
  for (;;) {
    lspawn::wire::NodeFrame f;
    const size_t used = lspawn::wire::decode_node_frame(got.data() + pos, got.size() - pos, f);
    if (used == 0) break;
    pos += used;
    if (f.type == "reject") reason = lspawn::node::Message{f.type, {f.body}}.as<lspawn::node::RejectMsg>().reason;
  }
  CHECK(reason.find(why) != std::string::npos);
}
