// Frozen nodes and fenced rounds (docs/multi-node.md, "Frozen nodes"; docs/security.md, "Rounds";
// docs/reliability.md's fault matrix): lspawns on 127.0.0.1 as nodes, one of them stopped with
// SIGSTOP (its lspawn alone, or its lspawn and its workers: the whole node) within and past
// --node-timeout; and a worker of round 0 that wakes up late and tries the new round's store.
#include <catch2/catch.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <unistd.h>

#include "harness.hpp"
#include "sys/sys.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {

const std::string kHost = lspawn::sys::hostname();
const std::string kSecret = "f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec0f3ec";

std::vector<std::string> lspawn_args(std::vector<std::string> args) {
  args.insert(args.begin(), lspawn_bin());
  return args;
}

// The names in `dir`, "." and ".." left out.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

// What the job left: /dev/shm segments of its workers (sys/shm_segments.hpp: "...-PID-NONCE"),
// and anything in the lspawns' TMPDIR (their run directories).
std::vector<std::string> leftovers(const std::set<pid_t>& workers, const std::string& tmpdir) {
  std::vector<std::string> out;
  for (const auto& n : entries("/dev/shm")) {
    for (pid_t p : workers)
      if (n.find("-" + std::to_string(p) + "-") != std::string::npos) out.push_back("/dev/shm/" + n);
  }
  for (const auto& n : entries(tmpdir)) out.push_back(tmpdir + "/" + n);
  return out;
}

// The pids the workers wrote to DIR/pid-<RANK> ("echo $$ > ..."), `n` of them, waited for (10 s).
std::set<pid_t> pid_files(const std::string& dir, int n) {
  std::set<pid_t> pids;
  for (int i = 0; i < 500 && static_cast<int>(pids.size()) < n; ++i) {
    pids.clear();
    for (int r = 0; r < n; ++r) {
      std::ifstream f(dir + "/pid-" + std::to_string(r));
      int p = 0;
      if (f >> p) pids.insert(p);
    }
    if (static_cast<int>(pids.size()) < n) std::this_thread::sleep_for(20ms);
  }
  return pids;
}

void signal_all(const std::set<pid_t>& pids, int sig) {
  for (pid_t p : pids) ::kill(p, sig);
}

// A static two-node job of one /bin/sh worker per node (`script`), with --node-timeout 2.
std::vector<std::string> static_node(int rank, const std::string& port, const std::string& script) {
  return lspawn_args({"--nnodes", "2", "--node-rank", std::to_string(rank), "--nprocs", "1", "--master-port", port,
                      "--node-timeout", "2", "--grace-period", "1", "/bin/sh", "-c", script});
}

bool wait_err(Child& c, const std::string& needle, std::chrono::seconds limit = 30s) {
  return c.wait_output(
      [&](const std::string&, const std::string& err) { return err.find(needle) != std::string::npos; }, limit);
}

bool wait_out(Child& c, const std::string& needle, std::chrono::seconds limit = 30s) {
  return c.wait_output(
      [&](const std::string& out, const std::string&) { return out.find(needle) != std::string::npos; }, limit);
}

// The first number after `label` in `text` that follows `after`; -1 when there is none.
int number_after(const std::string& text, const std::string& after, const std::string& label) {
  const size_t at = text.find(after);
  if (at == std::string::npos) return -1;
  std::smatch m;
  const std::string rest = text.substr(at);
  if (!std::regex_search(rest, m, std::regex(label + " ([0-9]+)"))) return -1;
  return std::stoi(m[1]);
}

}  // namespace

TEST_CASE("frozen: a node stopped within --node-timeout (its lspawn alone, or with its workers) costs nothing",
          "[e2e][multinode][frozen][exec-only]") {
  const bool whole_node = GENERATE(false, true);
  INFO((whole_node ? "the whole node" : "its lspawn alone"));
  Subreaper reaper;
  TempDir dir;
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  const std::string script = "echo $$ > " + dir.path + "/pid-$RANK; exec sleep 3";
  Child a(static_node(0, port, script));
  Child b(static_node(1, port, script));
  const std::set<pid_t> pids = pid_files(dir.path, 2);
  REQUIRE(pids.size() == 2);
  std::set<pid_t> frozen{b.pid()};
  if (whole_node) {  // and node 1's worker (rank 1)
    int worker1 = 0;
    std::ifstream(dir.path + "/pid-1") >> worker1;
    REQUIRE(worker1 > 0);
    frozen.insert(worker1);
  }
  signal_all(frozen, SIGSTOP);
  std::this_thread::sleep_for(1s);  // half of --node-timeout 2
  signal_all(frozen, SIGCONT);
  const int sa = a.wait(30s), sb = b.wait(30s);
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  CHECK(a.err().find("was lost") == std::string::npos);
  CHECK(alive_after(pids, 5s).empty());
}

TEST_CASE(
    "frozen: a node stopped past --node-timeout is named lost (123) - resumed, it stops its workers and exits 123",
    "[e2e][multinode][frozen][exec-only]") {
  const bool whole_node = GENERATE(false, true);
  INFO((whole_node ? "the whole node" : "its lspawn alone"));
  Subreaper reaper;
  TempDir dir, tmp;
  ReservedPort held_port;
  const std::string port = std::to_string(held_port.port());
  const std::string script = "echo $$ > " + dir.path + "/pid-$RANK; exec sleep 60";
  const std::vector<std::string> env{"TMPDIR=" + tmp.path};
  Child a(static_node(0, port, script), env);
  Child b(static_node(1, port, script), env);
  const std::set<pid_t> pids = pid_files(dir.path, 2);
  REQUIRE(pids.size() == 2);
  int worker1 = 0;
  std::ifstream(dir.path + "/pid-1") >> worker1;
  REQUIRE(worker1 > 0);
  std::set<pid_t> frozen{b.pid()};
  if (whole_node) frozen.insert(worker1);
  signal_all(frozen, SIGSTOP);
  const int sa = a.wait(30s);
  INFO(a.err() << "----\n" << b.err());
  CHECK(code_of(sa) == 123);
  CHECK(a.err().find("root cause: node 1 (" + kHost + ", 127.0.0.1) was lost: nothing received for 2 s") !=
        std::string::npos);
  // While its lspawn is stopped, nothing of lspawn's stops its worker: it runs on (or stays
  // stopped with the node), fenced out of any later round (docs/multi-node.md, "Frozen nodes").
  CHECK(::kill(worker1, 0) == 0);
  signal_all(frozen, SIGCONT);
  const int sb = b.wait(30s);
  INFO(b.err());
  CHECK(code_of(sb) == 123);
  CHECK(b.err().find("root cause: node 0 (") != std::string::npos);
  CHECK(b.err().find("was lost") != std::string::npos);
  CHECK(alive_after(pids, 5s).empty());
  CHECK(leftovers(pids, tmp.path).empty());
}

TEST_CASE(
    "fenced: a worker of round 0 whose node was frozen past --node-timeout wakes up late - its store port is "
    "refused, its records are not read by round 1, whose all_reduce is right",
    "[e2e][multinode][frozen][elastic][exec-only]") {
  Subreaper reaper;
  TempDir dir, tmp;
  ReservedPort held_ep;
  const std::string ep = "127.0.0.1:" + std::to_string(held_ep.port());
  const std::vector<std::string> args =
      lspawn_args({"--nnodes", "2:3", "--nprocs", "1", "--rdzv-endpoint", ep, "--node-timeout", "2", "--grace-period",
                   "1", "--rdzv-timeout", "60", "--max-restarts", "1", fence_probe_bin(), dir.path});
  const std::vector<std::string> env{"LSPAWN_JOB_SECRET=" + kSecret, "TMPDIR=" + tmp.path, "LSPAWN_PG_TIMEOUT=20"};
  Child a(args, env);
  REQUIRE(wait_err(a, "rendezvous: waiting for 1 to 2 more nodes"));
  Child b(args, env);
  REQUIRE(wait_err(a, "rendezvous: 2 nodes joined"));
  Child c(args, env);  // the third: MAX, the job forms; node 2
  REQUIRE(wait_out(c, "round 0 rank 2/3 sum 3 "));
  REQUIRE(wait_out(a, "round 0 rank 0/3 sum 3 "));
  const int port0 = number_after(c.out(), "round 0 rank 2/3", "port");
  const pid_t stale = number_after(c.out(), "round 0 rank 2/3", "pid");
  REQUIRE(port0 > 0);
  REQUIRE(stale > 0);
  // The whole node freezes: its worker, then its lspawn.
  ::kill(stale, SIGSTOP);
  c.signal(SIGSTOP);
  REQUIRE(wait_out(a, "round 1 rank 0/2 sum 2 ", 40s));
  REQUIRE(wait_out(b, "round 1 rank 1/2 sum 2 ", 40s));
  const int port1 = number_after(a.out(), "round 1 rank 0/2", "port");
  CHECK(port1 > 0);
  CHECK(port1 != port0);  // a store port of round 1's own
  // The old worker wakes up (its lspawn still stopped), told the new round's port.
  { std::ofstream(dir.path + "/attack.tmp") << port1 << "\n"; }
  REQUIRE(std::rename((dir.path + "/attack.tmp").c_str(), (dir.path + "/attack").c_str()) == 0);
  ::kill(stale, SIGCONT);
  const int sa = a.wait(60s), sb = b.wait(60s);
  std::string report;
  {
    std::ifstream f(dir.path + "/stale");
    report.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  INFO(report << "----\n" << a.err() << "----\n" << b.err() << "----\n" << a.out() << b.out());
  CHECK(report.find("stale: round 0's store 127.0.0.1:" + std::to_string(port0) + ": connection refused\n") !=
        std::string::npos);
  CHECK(report.find("stale: wrote fence/stale into the store at 127.0.0.1:" + std::to_string(port1)) !=
        std::string::npos);
  CHECK(code_of(sa) == 0);
  CHECK(code_of(sb) == 0);
  CHECK(a.err().find("root cause: node 2 (" + kHost + ", 127.0.0.1) was lost: nothing received for 2 s") !=
        std::string::npos);
  CHECK(a.out().find("round 1 rank 0: fence/stale seen: no") != std::string::npos);
  CHECK(b.out().find("round 1 rank 1: fence/stale seen: no") != std::string::npos);
  CHECK(a.out().find("round 1 rank 0: sum again 2") != std::string::npos);
  CHECK(b.out().find("round 1 rank 1: sum again 2") != std::string::npos);
  // Resumed, the frozen node's lspawn finds its coordinator gone, reaps its worker, exits 123.
  c.signal(SIGCONT);
  const int sc = c.wait(30s);
  INFO(c.err() << "----\n" << c.out());
  CHECK(code_of(sc) == 123);
  CHECK(c.err().find("root cause: node 0 (") != std::string::npos);
  CHECK(c.out().find("stale: all_reduce of round 0 failed") != std::string::npos);
  CHECK(alive_after({stale}, 5s).empty());
  CHECK(leftovers({stale}, tmp.path).empty());
}
