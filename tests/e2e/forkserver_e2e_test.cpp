// `lspawn --start-method forkserver`: the program is executed once and forks every worker from
// its forkserver hook. (The rest of the e2e suite also runs under it: ctest's "forkserver: "
// tests.) These cases pin what is specific to it.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kForkserver = {"--start-method", "forkserver"};

std::vector<std::string> args(std::vector<std::string> rest) {
  std::vector<std::string> a = kForkserver;
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

// "pids SELF CHILD PARENT" lines of child-then-wait workers.
struct Pids {
  std::set<pid_t> workers, children, parents;
};
Pids parse_pids(const std::string& out) {
  Pids p;
  for (const auto& l : lines(out)) {
    const auto at = l.find("pids ");
    if (at == std::string::npos) continue;
    std::istringstream is(l.substr(at + 5));
    pid_t self, child, parent;
    if (is >> self >> child >> parent) {
      p.workers.insert(self);
      p.children.insert(child);
      p.parents.insert(parent);
    }
  }
  return p;
}

}  // namespace

TEST_CASE("forkserver: a program without the hook is refused before anything starts", "[e2e][forkserver]") {
  TempDir dir;
  const std::string script = dir.path + "/prog.sh";
  FILE* f = std::fopen(script.c_str(), "w");
  REQUIRE(f);
  std::fputs("#!/bin/sh\ntouch \"$0.ran\"\n", f);
  std::fclose(f);
  REQUIRE(::chmod(script.c_str(), 0755) == 0);
  for (const std::string& prog : {std::string("/bin/true"), script}) {
    auto r = run_lspawn(args({"--nprocs", "2", prog}));
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--start-method forkserver") != std::string::npos);
    CHECK(r.err.find("'" + prog + "'") != std::string::npos);
    CHECK(r.err.find("forkserver hook") != std::string::npos);
    CHECK(r.err.find("--start-method exec") != std::string::npos);
  }
  CHECK(::access((script + ".ran").c_str(), F_OK) != 0);
  auto bad = run_lspawn({"--start-method", "zygote", "/bin/true"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--start-method: expected exec, forkserver or warm") != std::string::npos);
}

TEST_CASE("forkserver: workers are children of one forkserver - which is gone after the run", "[e2e][forkserver]") {
  Child c({lspawn_bin(), "--start-method", "forkserver", "--nprocs", "3", worker_bin(), "child-then-wait"});
  REQUIRE(c.wait_stdout_count("pids ", 3, 10s));
  const Pids p = parse_pids(c.out());
  REQUIRE(p.workers.size() == 3);
  REQUIRE(p.parents.size() == 1);  // one forkserver forked them all
  const pid_t server = *p.parents.begin();
  CHECK(server != c.pid());
  CHECK(p.workers.count(server) == 0);
  CHECK(alive(server));
  c.signal(SIGTERM);
  const int st = c.wait(10s);
  REQUIRE(st != -1);
  CHECK(WEXITSTATUS(st) == 128 + SIGTERM);
  CHECK(c.err().find("terminated by lspawn with SIGTERM") != std::string::npos);
  // lspawn reaped the forkserver before exiting; the workers and their children are gone.
  CHECK_FALSE(alive(server));
  for (pid_t w : p.workers) CHECK_FALSE(alive(w));
  CHECK(alive_after(p.children, 10s).empty());  // at once; 10 s for a loaded machine
}

TEST_CASE("forkserver: lspawn killed by SIGKILL leaves no forkserver - worker or grandchild", "[e2e][forkserver]") {
  Subreaper reaper;  // orphans come to us: reaped, not "alive"
  Child c({lspawn_bin(), "--start-method", "forkserver", "--nprocs", "3", worker_bin(), "child-then-wait"});
  REQUIRE(c.wait_stdout_count("pids ", 3, 10s));
  const Pids p = parse_pids(c.out());
  std::set<pid_t> pids = p.workers;
  pids.insert(p.children.begin(), p.children.end());
  pids.insert(p.parents.begin(), p.parents.end());
  REQUIRE(pids.size() == 7);
  for (pid_t x : pids) REQUIRE(alive(x));
  c.signal(SIGKILL);
  CHECK(alive_after(pids, 10s).empty());  // at once; 10 s for a loaded machine
  c.wait(5s);
}

TEST_CASE("forkserver: a program that exits during static initialisation is reported", "[e2e][forkserver]") {
  auto r = run_lspawn(args({"--nprocs", "2", worker_bin(), "env"}), {"LSPAWN_TEST_EXIT_IN_INIT=9"});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("exited with code 9 before it was ready") != std::string::npos);
  CHECK(r.out.find("RANK=") == std::string::npos);  // no worker ran
}

TEST_CASE("forkserver: threads running after static initialisation make it refuse",
          "[e2e][forkserver][counts-threads]") {
  auto r = run_lspawn(args({"--nprocs", "2", worker_bin(), "env"}), {"LSPAWN_TEST_THREAD_IN_INIT=1"});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("refused: 2 threads run after the program's static initialisation") != std::string::npos);
  CHECK(r.err.find("--start-method exec") != std::string::npos);
  CHECK(r.out.find("RANK=") == std::string::npos);
}

TEST_CASE("forkserver: SIGTERM to lspawn while the forkserver starts - exit 143 and nothing left",
          "[e2e][forkserver]") {
  Subreaper reaper;  // orphans come to us: reaped, not "alive"
  // The program's static initialisation never ends (it waits in a constructor before the hook).
  Child c({lspawn_bin(), "--start-method", "forkserver", worker_bin(), "env"},
          {"LSPAWN_TEST_EXIT_IN_INIT=", "LSPAWN_TEST_SLEEP_IN_INIT=1"});
  REQUIRE(c.wait_output(
      [](const std::string&, const std::string& err) { return err.find("starting 1 worker") != std::string::npos; },
      10s));
  std::this_thread::sleep_for(200ms);
  // lspawn's children now: the guardian and the forkserver that never gets ready.
  std::set<pid_t> children;
  {
    const std::string id = std::to_string(c.pid());
    std::ifstream f("/proc/" + id + "/task/" + id + "/children");
    for (pid_t p; f >> p;) children.insert(p);
  }
  REQUIRE(children.size() == 2);
  c.signal(SIGTERM);
  const int st = c.wait(10s);
  REQUIRE(st != -1);
  CHECK(WEXITSTATUS(st) == 128 + SIGTERM);
  CHECK(c.err().find("while the forkserver started") != std::string::npos);
  CHECK(alive_after(children, 10s).empty());  // at once; 10 s for a loaded machine
}

TEST_CASE("forkserver: at exit the program's static destructors run and buffered output is flushed",
          "[e2e][forkserver]") {
  for (const char* full : {"1", "0"}) {  // the fast exit (default), and the full one
    auto r = run_lspawn(args({"--quiet", worker_bin(), "exit-with-buffers", "5"}),
                        {std::string("LSPAWN_FORKSERVER_FAST_EXIT=") + full});
    INFO(r.err);
    CHECK(r.exit_code == 5);
    CHECK(count(r.out, "[rank 0] buffered, no newline") == 1);
    CHECK(count(r.out, "[rank 0] function-local static destructor ran") == 1);
    CHECK(count(r.out, "[rank 0] global destructor ran") == 1);
  }
}
