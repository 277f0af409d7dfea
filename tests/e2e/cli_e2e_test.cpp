// lspawn's command line: usage errors, --help/--version, programs that cannot run, the port.
#include <catch2/catch.hpp>

#include <fstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.hpp"

using namespace lspawn::test;

TEST_CASE("usage errors exit 2 - name the option and start nothing", "[e2e][cli]") {
  TempDir dir;
  const std::string marker = dir.path + "/started";
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--nprocs", "abc"}, "--nprocs: expected a positive integer (--nprocs N), got 'abc'"},
      {{"--nprocs=0"}, "--nprocs: 0 is out of range"},
      {{"--nproc-per-node", "-3"}, "--nproc-per-node"},
      {{"--grace-period", "-1"}, "--grace-period: expected a number of seconds >= 0"},
      {{"--grace-period=soon"}, "--grace-period"},
      {{"--master-port", "70000"}, "--master-port: 70000 is out of range 0..65535"},
      {{"--max-restarts", "x"}, "--max-restarts: expected an integer >= 0"},
      {{"--bogus"}, "--bogus: unknown option"},
      {{"--tee"}, "--tee: needs --log-dir"},
      {{"--quiet=yes"}, "--quiet: takes no value"},
      {{"--node-rank", "1"}, "--node-rank: 1 must be less than --nnodes 1"},
      {{"--nnodes", "2"}, "--master-port: required when --nnodes > 1"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {worker_bin(), "touch", marker});
    auto r = run_lspawn(args);
    INFO("args: " << c.args[0] << " ; stderr: " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.needle) != std::string::npos);
    CHECK(access(marker.c_str(), F_OK) != 0);
  }
  SECTION("a missing value and a missing program") {
    auto r = run_lspawn({"--nprocs"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--nprocs: missing value (--nprocs N)") != std::string::npos);
    r = run_lspawn({"--nprocs", "2"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("missing program") != std::string::npos);
  }
}

TEST_CASE("both --opt value and --opt=value - and args after the program are the program's", "[e2e][cli][exec-only]") {
  auto r2 = run_lspawn({"--nprocs=2", "--grace-period", "1", "--quiet", "--", "/bin/echo", "--nprocs", "7"});
  CHECK(r2.exit_code == 0);
  CHECK(count(r2.out, "--nprocs 7\n") == 2);
}

TEST_CASE("option --help and --version", "[e2e][cli]") {
  auto r = run_lspawn({"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("usage: lspawn") != std::string::npos);
  CHECK(r.out.find("--grace-period") != std::string::npos);
  r = run_lspawn({"--version"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("lspawn ", 0) == 0);
}

TEST_CASE("a missing program: 127 and its name - nothing started", "[e2e][cli]") {
  auto r = run_lspawn({"--nprocs", "2", "lspawn-no-such-program-xyz"});
  CHECK(r.exit_code == 127);
  CHECK(r.err.find("lspawn: cannot execute 'lspawn-no-such-program-xyz': No such file or directory") !=
        std::string::npos);
  CHECK(r.out.empty());
  r = run_lspawn({"/nonexistent/dir/prog"});
  CHECK(r.exit_code == 127);
  CHECK(r.err.find("cannot execute '/nonexistent/dir/prog'") != std::string::npos);
}

TEST_CASE("a program that is not executable: 126", "[e2e][cli]") {
  TempDir dir;
  const std::string prog = dir.path + "/script.sh";
  std::ofstream(prog) << "#!/bin/sh\necho should not run\n";
  chmod(prog.c_str(), 0644);
  auto r = run_lspawn({"--nprocs", "2", prog});
  CHECK(r.exit_code == 126);
  CHECK(r.err.find("cannot execute '" + prog + "': Permission denied") != std::string::npos);
  CHECK(r.out.find("should not run") == std::string::npos);
  // A directory is not executable either (even for root).
  r = run_lspawn({dir.path});
  CHECK(r.exit_code == 126);
}

TEST_CASE("option --master-port already in use: message and exit 2 before anything starts", "[e2e][cli]") {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(listen(fd, 4) == 0);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string port = std::to_string(ntohs(sa.sin_port));
  TempDir dir;
  const std::string marker = dir.path + "/started";
  auto r = run_lspawn({"--master-port", port, worker_bin(), "touch", marker});
  close(fd);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("lspawn: --master-port " + port + ": 127.0.0.1:" + port +
                   " is already in use (bind: Address already in use)") != std::string::npos);
  CHECK(access(marker.c_str(), F_OK) != 0);
}

TEST_CASE("the reserved MASTER_PORT can be bound and listened on by a worker (TCPStore-style)", "[e2e][cli]") {
  auto r = run_lspawn({"--quiet", worker_bin(), "bind-master-port"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[rank 0] bound ") != std::string::npos);
}
