#include <catch2/catch.hpp>

#include "launcher/cli_options.hpp"

using lspawn::CliOptions;
using lspawn::parse_cli;
using lspawn::UsageError;

TEST_CASE("parse_cli: defaults", "[cli]") {
  CliOptions o = parse_cli({"prog"});
  CHECK(o.nproc_per_node == 1);
  CHECK(o.nnodes == 1);
  CHECK(o.node_rank == 0);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 0);
  CHECK(o.run_id.empty());
  CHECK(o.grace_period_s == 5.0);
  CHECK(o.prefix);
  CHECK_FALSE(o.quiet);
  CHECK(o.program == std::vector<std::string>{"prog"});
}

TEST_CASE("parse_cli: both spellings - torchrun's underscores - program args untouched", "[cli]") {
  CliOptions o = parse_cli({"--nprocs=4", "--master-port", "1234", "--grace-period=0.5", "--run_id", "r",
                            "--nproc_per_node", "3", "--no-prefix", "--quiet", "--log-dir", "/x", "--tee",
                            "--max-restarts=0", "prog", "--nprocs", "9", "-h"});
  CHECK(o.nproc_per_node == 3);
  CHECK(o.master_port == 1234);
  CHECK(o.grace_period_s == 0.5);
  CHECK(o.run_id == "r");
  CHECK_FALSE(o.prefix);
  CHECK(o.quiet);
  CHECK(o.log_dir == "/x");
  CHECK(o.tee);
  CHECK_FALSE(o.help);
  CHECK(o.program == std::vector<std::string>{"prog", "--nprocs", "9", "-h"});
}

TEST_CASE("parse_cli: -- ends the options", "[cli]") {
  CliOptions o = parse_cli({"--nprocs", "2", "--", "--weird-program", "a"});
  CHECK(o.program == std::vector<std::string>{"--weird-program", "a"});
}

TEST_CASE("parse_cli: help and version need no program", "[cli]") {
  CHECK(parse_cli({"--help"}).help);
  CHECK(parse_cli({"-h"}).help);
  CHECK(parse_cli({"--version"}).version);
}

TEST_CASE("parse_cli: malformed options name the option and the accepted form", "[cli]") {
  auto msg = [](std::vector<std::string> args) -> std::string {
    try {
      parse_cli(args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  CHECK(msg({"--nprocs", "abc", "p"}) == "--nprocs: expected a positive integer (--nprocs N), got 'abc'");
  CHECK(msg({"--nprocs", "0", "p"}) == "--nprocs: 0 is out of range 1..4096 (--nprocs N)");
  CHECK(msg({"--nprocs", "99999999999", "p"}).find("--nprocs: expected a positive integer") == 0);
  CHECK(msg({"--nprocs"}) == "--nprocs: missing value (--nprocs N)");
  CHECK(msg({"--grace-period", "-1", "p"}).find("--grace-period: expected a number of seconds >= 0") == 0);
  CHECK(msg({"--grace-period", "1e3", "p"}).find("--grace-period") == 0);
  CHECK(msg({"--grace-period", "nan", "p"}).find("--grace-period") == 0);
  CHECK(msg({"--master-port", "65536", "p"}) == "--master-port: 65536 is out of range 0..65535 (--master-port PORT)");
  CHECK(msg({"--max-restarts", "-1", "p"}) == "--max-restarts: expected an integer >= 0 (--max-restarts K), got '-1'");
  CHECK(msg({"--nnodes", "1:4", "p"}).find("--nnodes: elastic ranges (MIN:MAX) are not supported") == 0);
  CHECK(msg({"--rdzv-endpoint", "h:0", "p"}).find("--rdzv-endpoint: 0 is out of range 1..65535") == 0);
  CHECK(msg({"--rdzv-endpoint", ":5", "p"}) == "--rdzv-endpoint: empty host (--rdzv-endpoint HOST:PORT)");
  CHECK(msg({"--rdzv-backend", "etcd", "p"}).find("--rdzv-backend: lspawn's own rendezvous") == 0);
  CHECK(msg({"--node-timeout", "0", "p"}).find("--node-timeout: must be at least 0.1 s") == 0);
  CHECK(msg({"--frobnicate", "p"}) == "--frobnicate: unknown option (see lspawn --help)");
  CHECK(msg({"-x", "p"}).find("-x: unknown option") == 0);
  CHECK(msg({"--tee=1", "p"}) == "--tee: takes no value (--tee), got '1'");
  CHECK(msg({}) == "missing program (lspawn [options] [--] program [args...])");
  CHECK(msg({"--nprocs", "2"}) == "missing program (lspawn [options] [--] program [args...])");
  CHECK(msg({"--nnodes", "2", "--node-rank", "2", "--master-port", "5", "p"}).find("--node-rank: 2 must be less than --nnodes 2") == 0);
  CHECK(msg({"--master-addr=", "p"}) == "--master-addr: empty address (--master-addr ADDR)");
}

TEST_CASE("parse_cli: multi-node options", "[cli][multinode]") {
  auto o = parse_cli({"--nnodes", "2", "--rdzv-endpoint", "node0:29411", "--rdzv-id", "j7", "--rdzv-backend",
                      "c10d", "--node-timeout", "3", "--rdzv-timeout", "9.5", "--max-restarts", "2", "p"});
  CHECK(o.nnodes == 2);
  CHECK(o.rdzv_host == "node0");
  CHECK(o.rdzv_port == 29411);
  CHECK(o.run_id == "j7");
  CHECK_FALSE(o.node_rank_given);
  CHECK(o.node_timeout_s == 3.0);
  CHECK(o.rdzv_timeout_s == 9.5);
  CHECK(o.max_restarts == 2);
  auto d = parse_cli({"--nnodes", "2", "--rdzv-endpoint", "node0", "p"});
  CHECK(d.rdzv_port == 29400);  // torchrun's default
  auto v6 = parse_cli({"--rdzv-endpoint", "[::1]:7000", "p"});
  CHECK(v6.rdzv_host == "::1");
  CHECK(v6.rdzv_port == 7000);
  auto s = parse_cli({"--nnodes", "2", "--node-rank", "1", "--master-port", "29500", "p"});
  CHECK(s.node_rank_given);
  CHECK(s.rdzv_endpoint.empty());
}

TEST_CASE("parse_cli: --start-method exec, forkserver or warm - --warm - --daemon-socket", "[cli]") {
  CHECK(parse_cli({"prog"}).start_method == lspawn::CliStartMethod::Exec);
  CHECK(parse_cli({"--start-method", "forkserver", "prog"}).start_method ==
        lspawn::CliStartMethod::Forkserver);
  CHECK(parse_cli({"--start_method=exec", "prog"}).start_method == lspawn::CliStartMethod::Exec);
  CHECK(parse_cli({"--start-method", "warm", "prog"}).start_method == lspawn::CliStartMethod::Warm);
  const CliOptions w = parse_cli({"--warm", "--daemon-socket", "/run/d.sock", "prog"});
  CHECK(w.start_method == lspawn::CliStartMethod::Warm);
  CHECK(w.daemon_socket == "/run/d.sock");
  CHECK(parse_cli({"prog"}).daemon_socket.empty());
  CHECK_THROWS_WITH(parse_cli({"--start-method", "fork", "prog"}),
                    "--start-method: expected exec, forkserver or warm (--start-method exec|forkserver|warm), got 'fork'");
  CHECK_THROWS_WITH(parse_cli({"--start-method"}),
                    "--start-method: missing value (--start-method exec|forkserver|warm)");
  CHECK_THROWS_WITH(parse_cli({"--daemon-socket", "", "prog"}), "--daemon-socket: empty path (--daemon-socket PATH)");
}

TEST_CASE("parse_cli: records which options were given, by canonical name", "[cli]") {
  const CliOptions o = parse_cli({"--nproc_per_node=2", "--master-port", "5", "--run_id", "r", "prog"});
  CHECK(o.was_given("--nprocs"));
  CHECK(o.was_given("--master-port"));
  CHECK(o.was_given("--run-id"));
  CHECK_FALSE(o.was_given("--nnodes"));
  CHECK_FALSE(o.was_given("--master-addr"));
  // --node-rank alone is checked against the detected node count later (resolve_launch)
  CHECK(parse_cli({"--node-rank", "1", "prog"}).node_rank == 1);
}

TEST_CASE("parse_cli: --hang-timeout SECONDS", "[cli][hang]") {
  CHECK(parse_cli({"p"}).hang_timeout_s == 0);  // off by default
  CHECK(parse_cli({"--hang-timeout", "1.5", "p"}).hang_timeout_s == 1.5);
  CHECK(parse_cli({"--hang_timeout=60", "p"}).hang_timeout_s == 60);
  CHECK_THROWS_WITH(parse_cli({"--hang-timeout", "soon", "p"}),
                    Catch::StartsWith("--hang-timeout: expected a number of seconds >= 0"));
  CHECK_THROWS_WITH(parse_cli({"--hang-timeout"}), "--hang-timeout: missing value (--hang-timeout SECONDS)");
}
