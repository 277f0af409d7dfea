#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

#include <cstdio>
#include <cstdlib>

#include "launcher/cli_options.hpp"
#include "launchenv/launch_env.hpp"
#include "launcher/torchrun_compat.hpp"
#include "placement/cpu_list.hpp"
#include "support/env_lookup.hpp"

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
  CHECK(o.grace_period_s == 30.0);  // torchrun's default
  CHECK(o.omp_threads == 0);        // the default share (env::omp_threads_default)
  CHECK(parse_cli({"--omp-threads", "3", "prog"}).omp_threads == 3);
  CHECK(parse_cli({"--numa-binding", "core-complex", "prog"}).numa_binding == "core-complex");
  CHECK(o.numa_binding.empty());
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
  CHECK(msg({"--nprocs", "abc", "p"}) ==
        "--nprocs: expected a positive integer, gpu, cpu or auto (--nprocs N|gpu|cpu|auto), got 'abc'");
  CHECK(msg({"--nprocs", "0", "p"}) == "--nprocs: 0 is out of range 1..4096 (--nprocs N|gpu|cpu|auto)");
  CHECK(msg({"--nprocs", "99999999999", "p"}).find("--nprocs: expected a positive integer") == 0);
  CHECK(msg({"--nprocs"}) == "--nprocs: missing value (--nprocs N|gpu|cpu|auto)");
  CHECK(msg({"--grace-period", "-1", "p"}).find("--grace-period: expected a number of seconds >= 0") == 0);
  CHECK(msg({"--omp-threads", "0", "p"}).find("--omp-threads: 0 is out of range 1..4096") == 0);
  CHECK(msg({"--no-restart-exit-codes", "3,x", "p"}).find("--no-restart-exit-codes: expected exit codes 0..255") == 0);
  CHECK(msg({"--no-restart-exit-codes", "256", "p"}).find("--no-restart-exit-codes: 256 is out of range 0..255") == 0);
  CHECK(msg({"--no-restart-exit-codes", "", "p"})
            .find("--no-restart-exit-codes: expected exit codes 0..255 separated by commas (--no-restart-exit-codes "
                  "CODE[,CODE...]), got ''") == 0);
  CHECK(parse_cli({"--no-restart-exit-codes", "2,3", "p"}).no_restart_exit_codes == std::vector<int>{2, 3});
  CHECK(msg({"--omp-threads", "two", "p"}).find("--omp-threads: expected an integer number of threads >= 1") == 0);
  CHECK(msg({"--grace-period", "1e3", "p"}).find("--grace-period") == 0);
  CHECK(msg({"--grace-period", "nan", "p"}).find("--grace-period") == 0);
  CHECK(msg({"--master-port", "65536", "p"}) == "--master-port: 65536 is out of range 0..65535 (--master-port PORT)");
  CHECK(msg({"--max-restarts", "-1", "p"}) == "--max-restarts: expected an integer >= 0 (--max-restarts K), got '-1'");
  CHECK(msg({"--nnodes", "1:4", "p"}).find("--nnodes 1:4: an elastic range needs --rdzv-endpoint HOST:PORT") == 0);
  CHECK(msg({"--nnodes", "4:1", "--rdzv-endpoint", "h", "p"}) ==
        "--nnodes: MIN must not exceed MAX (--nnodes MIN:MAX, e.g. 1:4), got '4:1'");
  CHECK(msg({"--nnodes", "0:4", "p"}) == "--nnodes: 0 is out of range 1..1048576 (--nnodes N|MIN:MAX)");
  CHECK(msg({"--nnodes", "1:x", "p"}).find("--nnodes: expected MIN:MAX with 1 <= MIN <= MAX") == 0);
  CHECK(msg({"--rdzv-endpoint", "h:0", "p"}).find("--rdzv-endpoint: 0 is out of range 1..65535") == 0);
  CHECK(msg({"--rdzv-endpoint", ":5", "p"}) == "--rdzv-endpoint: empty host (--rdzv-endpoint HOST:PORT)");
  CHECK(msg({"--rdzv-backend", "etcd", "p"}).find("--rdzv-backend: lspawn's own rendezvous") == 0);
  CHECK(msg({"--node-timeout", "0", "p"}).find("--node-timeout: must be at least 0.1 s") == 0);
  CHECK(msg({"--frobnicate", "p"}) == "--frobnicate: unknown option (see lspawn --help)");
  CHECK(msg({"-x", "p"}).find("-x: unknown option") == 0);
  CHECK(msg({"--tee=yes", "p"}).find("--tee: expected 0 none, 1 stdout, 2 stderr, 3 both") == 0);
  CHECK(msg({}) == "missing program (lspawn [options] [--] program [args...])");
  CHECK(msg({"--nprocs", "2"}) == "missing program (lspawn [options] [--] program [args...])");
  CHECK(msg({"--nnodes", "2", "--node-rank", "2", "--master-port", "5", "p"})
            .find("--node-rank: 2 must be less than --nnodes 2") == 0);
  CHECK(msg({"--master-addr=", "p"}) == "--master-addr: empty address (--master-addr ADDR)");
}

TEST_CASE("parse_cli: multi-node options", "[cli][multinode]") {
  auto o = parse_cli({"--nnodes", "2", "--rdzv-endpoint", "node0:29411", "--rdzv-id", "j7", "--rdzv-backend", "c10d",
                      "--node-timeout", "3", "--rdzv-timeout", "9.5", "--max-restarts", "2", "p"});
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
  CHECK(parse_cli({"--start-method", "forkserver", "prog"}).start_method == lspawn::CliStartMethod::Forkserver);
  CHECK(parse_cli({"--start_method=exec", "prog"}).start_method == lspawn::CliStartMethod::Exec);
  CHECK(parse_cli({"--start-method", "warm", "prog"}).start_method == lspawn::CliStartMethod::Warm);
  const CliOptions w = parse_cli({"--warm", "--daemon-socket", "/run/d.sock", "prog"});
  CHECK(w.start_method == lspawn::CliStartMethod::Warm);
  CHECK(w.daemon_socket == "/run/d.sock");
  CHECK(parse_cli({"prog"}).daemon_socket.empty());
  CHECK_THROWS_WITH(
      parse_cli({"--start-method", "threads", "prog"}),
      "--start-method: expected exec, forkserver or warm (--start-method exec|forkserver|warm), got 'threads'");
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

// ---- torchrun's command line (torchrun_compat.hpp, docs/cli.md "From torchrun") ----

namespace {
std::string usage_msg(std::vector<std::string> args) {
  try {
    lspawn::parse_cli(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}
}  // namespace

TEST_CASE("parse_cli: --nproc-per-node gpu|cpu|auto in both spellings and with =value", "[cli][torchrun]") {
  for (const std::string spec : {"gpu", "cpu", "auto"}) {
    INFO(spec);
    CHECK(parse_cli({"--nproc-per-node", spec, "p"}).nproc_spec == spec);
    CHECK(parse_cli({"--nproc_per_node=" + spec, "p"}).nproc_spec == spec);
    CHECK(parse_cli({"--nproc-per-node=" + spec, "p"}).was_given("--nprocs"));
  }
  // A later count replaces an earlier spec.
  const CliOptions o = parse_cli({"--nproc-per-node", "auto", "--nproc_per_node", "3", "p"});
  CHECK(o.nproc_spec.empty());
  CHECK(o.nproc_per_node == 3);
  CHECK(
      usage_msg({"--nproc-per-node", "gpus", "p"}) ==
      "--nproc-per-node: expected a positive integer, gpu, cpu or auto (--nproc-per-node N|gpu|cpu|auto), got 'gpus'");
  CHECK(usage_msg({"--nproc_per_node=xpu", "p"}) ==
        "--nproc-per-node: 'xpu' is not supported: lspawn counts NVIDIA GPUs only (--nproc-per-node N|gpu|cpu|auto)");
}

TEST_CASE("resolve_nproc_spec: auto is the GPUs, else the CPUs - gpu without one names the flag", "[cli][torchrun]") {
  std::string how;
  CHECK(lspawn::resolve_nproc_spec("auto", 0, 6, nullptr, 4096, &how) == 6);
  CHECK(how == "6 CPUs usable by this process");
  CHECK(lspawn::resolve_nproc_spec("auto", 2, 6, nullptr, 4096, &how) == 2);
  CHECK(how == "2 GPUs");
  CHECK(lspawn::resolve_nproc_spec("cpu", 2, 6, nullptr, 4096, &how) == 6);
  CHECK(lspawn::resolve_nproc_spec("gpu", 4, 6, "0,1,2,3", 4096, &how) == 4);
  CHECK_THROWS_WITH(lspawn::resolve_nproc_spec("gpu", 0, 6, nullptr, 4096, &how),
                    "--nproc-per-node gpu: no NVIDIA GPU is visible to this process (CUDA_VISIBLE_DEVICES unset "
                    "and no /dev/nvidiaN device); give a count (--nproc-per-node N) or cpu|auto");
  CHECK_THROWS_WITH(lspawn::resolve_nproc_spec("gpu", 0, 6, "", 4096, &how),
                    Catch::Contains("(CUDA_VISIBLE_DEVICES='')"));
  CHECK_THROWS_WITH(lspawn::resolve_nproc_spec("cpu", 0, 5000, nullptr, 4096, &how),
                    Catch::StartsWith("--nproc-per-node cpu: 5000 CPUs usable by this process, more than 4096"));
}

TEST_CASE("usable_cpu_count is what nproc(1) prints (sched_getaffinity)", "[cli][torchrun]") {
  FILE* p = ::popen("nproc", "r");
  REQUIRE(p != nullptr);
  char buf[32] = {};
  const bool got = std::fgets(buf, sizeof buf, p) != nullptr;
  ::pclose(p);
  REQUIRE(got);
  CHECK(lspawn::placement::usable_cpu_count() == std::atoi(buf));
}

TEST_CASE("parse_cli: --standalone - and what it cannot be combined with", "[cli][torchrun]") {
  CHECK_FALSE(parse_cli({"p"}).standalone);
  CHECK(parse_cli({"--standalone", "p"}).standalone);
  CHECK(parse_cli({"--standalone", "--nnodes=1", "p"}).standalone);
  CHECK(usage_msg({"--standalone=1", "p"}) == "--standalone: takes no value (--standalone), got '1'");
  CHECK(usage_msg({"--standalone", "--rdzv-endpoint", "h:5", "p"}) ==
        "--standalone: cannot be combined with --rdzv-endpoint h:5 (--standalone is one node with a local "
        "rendezvous on a free port)");
  CHECK(usage_msg({"--nnodes", "2", "--standalone", "p"}).find("--standalone: cannot be combined with --nnodes 2") ==
        0);
}

TEST_CASE("resolve_launch: --standalone is one node whatever Slurm says", "[cli][torchrun]") {
  const std::map<std::string, std::string> slurm = {{"SLURM_JOB_ID", "42"},
                                                    {"SLURM_STEP_ID", "0"},
                                                    {"SLURM_NNODES", "2"},
                                                    {"SLURM_NODEID", "1"},
                                                    {"SLURM_STEP_NODELIST", "n[01-02]"},
                                                    {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};
  const lspawn::EnvLookup env = [&](const std::string& k) -> std::optional<std::string> {
    auto it = slurm.find(k);
    if (it == slurm.end()) return std::nullopt;
    return it->second;
  };
  const auto detected = lspawn::resolve_launch(parse_cli({"p"}), env);
  CHECK(detected.nnodes == 2);  // the control: without --standalone, Slurm's two nodes
  const auto s = lspawn::resolve_launch(parse_cli({"--standalone", "p"}), env);
  CHECK(s.nnodes == 1);
  CHECK(s.node_rank == 0);
  CHECK(s.master_port == 0);
  CHECK(s.master_addr == "127.0.0.1");
  CHECK(s.scheduler == lspawn::Scheduler::None);
  CHECK(s.detected.empty());
}

TEST_CASE("parse_cli: -m/--module, --no-python, --run-path", "[cli][torchrun]") {
  const CliOptions m = parse_cli({"-m", "pkg.train", "--lr", "1"});
  CHECK(m.program_convention.module);
  CHECK(m.program == std::vector<std::string>{"pkg.train", "--lr", "1"});
  CHECK(parse_cli({"--module", "pkg", "p"}).program_convention.module);
  CHECK(parse_cli({"--no-python", "p"}).program_convention.no_python);
  CHECK(parse_cli({"--no_python", "p"}).program_convention.no_python);
  CHECK(parse_cli({"--run_path", "/a/s.py"}).program_convention.run_path);
  CHECK(parse_cli({"--run-path", "/a/s.py"}).program_convention.run_path);
  CHECK(usage_msg({"--no-python", "-m", "pkg"}) == "--no-python: cannot be combined with -m/--module (as torchrun)");
  CHECK(usage_msg({"--module=x", "pkg"}) == "--module: takes no value (--module), got 'x'");
}

TEST_CASE("worker_command: .py and -m run under Python with -u, --no-python and other programs are exec'd",
          "[cli][torchrun]") {
  using V = std::vector<std::string>;
  lspawn::ProgramConvention c;
  std::string why;
  CHECK(lspawn::worker_command({"train.py", "--x"}, c, "/usr/bin/python3", &why) ==
        V{"/usr/bin/python3", "-u", "train.py", "--x"});
  CHECK(why == "a .py program");
  CHECK(lspawn::worker_command({"./worker", "a.py"}, c, "py", &why) == V{"./worker", "a.py"});
  CHECK(why.empty());
  CHECK(lspawn::worker_command({"train.pyc"}, c, "py", &why) == V{"train.pyc"});
  c.module = true;
  CHECK(lspawn::worker_command({"pkg.mod", "1"}, c, "py", &why) == V{"py", "-u", "-m", "pkg.mod", "1"});
  CHECK(why == "-m");
  c = {};
  c.no_python = true;
  CHECK(lspawn::worker_command({"train.py"}, c, "py", &why) == V{"train.py"});
  CHECK(why.empty());
  c.run_path = true;  // takes precedence over --no-python, as in torchrun
  CHECK(lspawn::worker_command({"/abs/s"}, c, "py", &why) == V{"py", "-u", "/abs/s"});
  CHECK(why == "--run-path");
  c = {};
  c.unbuffered = false;  // --preload: no interpreter option per worker
  CHECK(lspawn::worker_command({"train.py", "--x"}, c, "py", &why) == V{"py", "train.py", "--x"});
  c.module = true;
  CHECK(lspawn::worker_command({"pkg.mod"}, c, "py", &why) == V{"py", "-m", "pkg.mod"});
}

TEST_CASE("python_interpreter: $LSPAWN_PYTHON, else $PYTHON_EXEC, else python3", "[cli][torchrun]") {
  std::map<std::string, std::string> vars;
  const lspawn::EnvLookup env = [&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  std::string source;
  CHECK(lspawn::python_interpreter(env, &source) == "python3");
  CHECK(source == "default");
  vars["PYTHON_EXEC"] = "/opt/py/bin/python";
  CHECK(lspawn::python_interpreter(env, &source) == "/opt/py/bin/python");
  CHECK(source == "PYTHON_EXEC");
  vars["LSPAWN_PYTHON"] = "/usr/bin/python3";
  CHECK(lspawn::python_interpreter(env, &source) == "/usr/bin/python3");
  CHECK(source == "LSPAWN_PYTHON");
}

TEST_CASE("parse_std_spec: torchrun's 0..3 and LOCAL_RANK:V lists - std_route: redirect, tee, console",
          "[cli][torchrun]") {
  CHECK(lspawn::parse_std_spec("3")->all == 3);
  CHECK(lspawn::parse_std_spec("0")->all == 0);
  const auto m = lspawn::parse_std_spec("0:1,1:2,12:3");
  REQUIRE(m);
  CHECK(m->mask_for(0) == 1);
  CHECK(m->mask_for(1) == 2);
  CHECK(m->mask_for(12) == 3);
  CHECK(m->mask_for(2) == 0);
  for (const std::string bad : {"", "4", "x", "0:4", "0:1,", ":1", "0:1,1", "-1", "1:2:3", "./prog"}) {
    INFO(bad);
    CHECK_FALSE(lspawn::parse_std_spec(bad));
  }
  const lspawn::StdSpec none, all{3, {}, false};
  auto r = lspawn::std_route(all, none, 0, false);  // redirected: files only
  CHECK((r.file && !r.console));
  r = lspawn::std_route(none, all, 0, true);  // tee'd: both
  CHECK((r.file && r.console));
  r = lspawn::std_route(all, all, 0, true);  // tee wins over redirect
  CHECK((r.file && r.console));
  r = lspawn::std_route(none, none, 0, false);  // neither: console only
  CHECK((!r.file && r.console));
  const auto out_only = *lspawn::parse_std_spec("1");
  CHECK_FALSE(lspawn::std_route(out_only, none, 0, false).console);
  CHECK(lspawn::std_route(out_only, none, 0, true).console);
  CHECK_FALSE(lspawn::std_route(out_only, none, 0, true).file);
}

TEST_CASE("split_commas: every item of a comma-separated list, empty ones included", "[cli][torchrun]") {
  using V = std::vector<std::string>;
  CHECK(lspawn::split_commas("a") == V{"a"});
  CHECK(lspawn::split_commas("a,bc,d") == V{"a", "bc", "d"});
  CHECK(lspawn::split_commas("") == V{""});
  CHECK(lspawn::split_commas("a,,b") == V{"a", "", "b"});
  CHECK(lspawn::split_commas(",a,") == V{"", "a", ""});
}

TEST_CASE("parse_local_ranks: torchrun's comma-separated local ranks - filter_route: the others to the files only",
          "[cli][torchrun]") {
  CHECK(*lspawn::parse_local_ranks("0") == std::set<int>{0});
  CHECK(*lspawn::parse_local_ranks("2,0,2") == std::set<int>{0, 2});
  for (const std::string bad : {"", ",", "0,", ",1", "-1", "x", "0 1", "1.5", "0:1", "1234567"}) {
    INFO(bad);
    CHECK_FALSE(lspawn::parse_local_ranks(bad));
  }
  const std::set<int> shown{0, 2};
  const lspawn::StdSpec none, all{3, {}, false};
  for (const auto& [redirects, tee] : {std::pair{none, none}, {all, none}, {none, all}, {all, all}}) {
    for (bool err : {false, true}) {
      const auto base = lspawn::std_route(redirects, tee, 1, err);
      // A shown rank keeps its route; a hidden one leaves the console, and what torchrun would
      // send to /dev/null (neither redirected nor tee'd) goes to the files.
      const auto kept = lspawn::filter_route(base, shown, 2);
      CHECK((kept.console == base.console && kept.file == base.file));
      const auto hidden = lspawn::filter_route(base, shown, 1);
      CHECK((!hidden.console && hidden.file));
    }
  }
}

TEST_CASE("parse_cli: --local-ranks-filter takes local ranks, and names a bad list", "[cli][torchrun]") {
  CHECK(*parse_cli({"--local-ranks-filter", "0", "p"}).local_ranks_filter == std::set<int>{0});
  CHECK(*parse_cli({"--local_ranks_filter=1,0", "p"}).local_ranks_filter == std::set<int>{0, 1});
  CHECK_FALSE(parse_cli({"p"}).local_ranks_filter);
  for (const std::string bad : {"", "a", "0,-1", "0;1"}) {
    INFO(bad);
    CHECK(usage_msg({"--local-ranks-filter=" + bad, "p"}) ==
          "--local-ranks-filter: expected local ranks separated by commas (--local-ranks-filter 0, "
          "--local-ranks-filter 0,1), got '" +
              bad + "'");
  }
}

TEST_CASE("parse_cli: --redirects/-r and --tee/-t take torchrun's specs - --tee alone stays lspawn's flag",
          "[cli][torchrun]") {
  CHECK(parse_cli({"--redirects", "3", "p"}).redirects->all == 3);
  CHECK(parse_cli({"--redirects=0:1,1:2", "p"}).redirects->mask_for(1) == 2);
  CHECK(parse_cli({"-r", "2", "p"}).redirects->all == 2);
  CHECK(parse_cli({"-r1", "p"}).redirects->all == 1);
  CHECK(parse_cli({"--tee", "3", "p"}).tee_spec->all == 3);
  CHECK(parse_cli({"--tee=1", "p"}).tee_spec->all == 1);
  CHECK(parse_cli({"-t", "0:3", "p"}).tee_spec->mask_for(0) == 3);
  // --tee followed by something that is not a spec: the boolean, the next word is the program.
  const CliOptions b = parse_cli({"--log-dir", "/l", "--tee", "./prog", "3"});
  CHECK(b.tee);
  CHECK_FALSE(b.tee_spec);
  CHECK(b.program == std::vector<std::string>{"./prog", "3"});
  const CliOptions b2 = parse_cli({"--log-dir", "/l", "--tee", "--quiet", "p"});
  CHECK((b2.tee && b2.quiet));
  // A spec needs no --log-dir (a temporary one is made); the boolean still does.
  CHECK(usage_msg({"--tee", "3", "p"}) == "(accepted)");
  CHECK(usage_msg({"--tee", "p"}) == "--tee: needs --log-dir DIR (--log-dir DIR --tee), or a stream spec (--tee 3)");
  // --no-summary: the outcome must go to the result file instead of the console.
  CHECK(usage_msg({"--no-summary", "p"}) ==
        "--no-summary: needs --result-file PATH (the outcome must go somewhere: --result-file PATH --no-summary)");
  const CliOptions ns = parse_cli({"--result-file", "/r.json", "--no-summary", "p"});
  CHECK((ns.no_summary && ns.result_file == "/r.json"));
  CHECK(usage_msg({"--redirects", "4", "p"}) ==
        "--redirects: expected 0 none, 1 stdout, 2 stderr, 3 both, for every local rank, or LOCAL_RANK:V,... per "
        "local rank (--redirects 3, --redirects 0:1,1:2), got '4'");
  CHECK(usage_msg({"-r", "all", "p"}).find("--redirects: expected 0 none") == 0);
  CHECK(usage_msg({"--redirects"}) == "--redirects: missing value (--redirects SPEC)");
}

TEST_CASE("parse_cli: --rdzv-conf join_timeout/timeout set the rendezvous timeout - other keys are noted",
          "[cli][torchrun]") {
  CHECK(parse_cli({"--rdzv-conf", "join_timeout=900", "p"}).rdzv_timeout_s == 900);
  CHECK(parse_cli({"--rdzv_conf=timeout=30", "p"}).rdzv_timeout_s == 30);
  CHECK(parse_cli({"--rdzv-conf", "join_timeout=90,timeout=30", "p"}).rdzv_timeout_s == 90);
  CHECK(parse_cli({"--rdzv-conf", "timeout=30,join_timeout=90", "p"}).rdzv_timeout_s == 90);
  CHECK(parse_cli({"--rdzv-timeout", "7", "--rdzv-conf", "join_timeout=90", "p"}).rdzv_timeout_s == 7);
  const CliOptions o = parse_cli({"--rdzv-conf", "is_host=1,read_timeout=60,join_timeout=5", "p"});
  CHECK(o.rdzv_timeout_s == 5);
  REQUIRE(o.notes.size() == 1);
  CHECK(o.notes[0] ==
        "--rdzv-conf: ignored is_host, read_timeout (lspawn honours join_timeout and timeout, as --rdzv-timeout, and "
        "last_call_timeout)");
  CHECK(usage_msg({"--rdzv-conf", "join_timeout", "p"}) ==
        "--rdzv-conf: expected KEY=VALUE entries separated by commas (--rdzv-conf join_timeout=900,KEY=VALUE), got "
        "'join_timeout' in 'join_timeout'");
  CHECK(usage_msg({"--rdzv-conf", "join_timeout=soon", "p"})
            .find("--rdzv-conf join_timeout: expected a number of seconds") == 0);
}

TEST_CASE("parse_cli: --local-addr, --role, --monitor-interval, --signals-to-handle, --start-method spawn",
          "[cli][torchrun]") {
  const CliOptions o = parse_cli({"--rdzv-endpoint", "h:5", "--local_addr", "10.0.0.7", "--role=trainer", "p"});
  CHECK(o.local_addr == "10.0.0.7");
  CHECK(o.role == "trainer");
  CHECK(o.notes.empty());
  CHECK(parse_cli({"p"}).role == "default");
  const CliOptions st = parse_cli({"--local-addr", "10.0.0.7", "p"});
  REQUIRE(st.notes.size() == 1);
  CHECK(st.notes[0].find("--local-addr 10.0.0.7: ignored without --rdzv-endpoint") == 0);
  CHECK(usage_msg({"--local-addr=", "p"}) == "--local-addr: empty address (--local-addr ADDR)");
  CHECK(usage_msg({"--role", "", "p"}) == "--role: empty role (--role NAME)");
  const CliOptions mi = parse_cli({"--monitor_interval", "0.5", "p"});
  REQUIRE(mi.notes.size() == 1);
  CHECK(mi.notes[0].find("--monitor-interval: ignored") == 0);
  CHECK(usage_msg({"--monitor-interval", "often", "p"}).find("--monitor-interval: expected a number of seconds") == 0);
  CHECK(parse_cli({"--signals-to-handle", "SIGTERM,SIGUSR1", "p"}).notes.size() == 1);
  CHECK(usage_msg({"--signals_to_handle=SIGTERM,SIGPIPE", "p"})
            .find("--signals-to-handle: lspawn forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2") == 0);
  CHECK(usage_msg({"--signals_to_handle=SIGTERM,SIGPIPE", "p"}).find("'SIGPIPE' in 'SIGTERM,SIGPIPE'") !=
        std::string::npos);
  const CliOptions sp = parse_cli({"--start-method", "spawn", "p"});
  CHECK(sp.start_method == lspawn::CliStartMethod::Exec);
  CHECK(sp.notes.size() == 1);
  CHECK(parse_cli({"--start_method=fork", "p"}).start_method == lspawn::CliStartMethod::Exec);
}

TEST_CASE("parse_cli: --nnodes N:N is N - MIN:MAX is an elastic job, with --rdzv-endpoint and without --node-rank",
          "[cli][torchrun]") {
  CHECK(parse_cli({"--nnodes", "1:1", "p"}).nnodes == 1);
  CHECK(parse_cli({"--nnodes", "1:1", "p"}).min_nnodes == 0);
  CHECK(parse_cli({"--nnodes=2:2", "--rdzv-endpoint", "h", "p"}).nnodes == 2);
  const CliOptions e = parse_cli({"--nnodes", "1:4", "--rdzv-endpoint", "h:5", "p"});
  CHECK(e.min_nnodes == 1);
  CHECK(e.nnodes == 4);
  CHECK(e.last_call_s == 30);                                                   // torchrun's default
  CHECK(parse_cli({"--nnodes", "2:3", "--nnodes", "3", "p"}).min_nnodes == 0);  // the last one counts
  CHECK(usage_msg({"--nnodes", "1:4", "p"}) ==
        "--nnodes 1:4: an elastic range needs --rdzv-endpoint HOST:PORT (the nodes meet there; "
        "--master-addr/--master-port is a static job of a fixed node count)");
  CHECK(usage_msg({"--nnodes", "1:4", "--rdzv-endpoint", "h", "--node-rank", "1", "p"}) ==
        "--node-rank: an elastic job (--nnodes 1:4) numbers its nodes at each rendezvous; leave --node-rank out");
  CHECK(usage_msg({"--standalone", "--nnodes", "1:2", "p"}).find("--standalone: cannot be combined with --nnodes 2") ==
        0);
  // torchrun's last_call_timeout: how long an elastic rendezvous waits for more nodes after MIN.
  const CliOptions lc = parse_cli({"--rdzv-conf", "last_call_timeout=0.5", "p"});
  CHECK(lc.last_call_s == 0.5);
  CHECK(lc.notes.empty());
  CHECK(usage_msg({"--rdzv-conf", "last_call_timeout=-1", "p"})
            .find("--rdzv-conf last_call_timeout: expected a number of seconds") == 0);
}

TEST_CASE("parse_cli(args, env): torchrun's PET_* defaults - the command line wins, bad values name the variable",
          "[cli][torchrun]") {
  using Env = lspawn::test::EnvMap;
  const auto lookup = lspawn::test::lookup_of;
  auto env_msg = [&](std::vector<std::string> args, const Env& env) -> std::string {
    try {
      parse_cli(args, lookup(env));
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  // What an elasticPolicy sets (training-operator's elastic.go), beside the node variables.
  const Env elastic = {{"PET_RDZV_ENDPOINT", "job-worker-0:29400"},
                       {"PET_RDZV_BACKEND", "c10d"},
                       {"PET_MAX_RESTARTS", "3"},
                       {"PET_RDZV_CONF", "last_call_timeout=5,join_timeout=60"},
                       {"PET_NNODES", "2:3"},
                       {"PET_NPROC_PER_NODE", "2"}};
  const CliOptions o = parse_cli({"p"}, lookup(elastic));
  CHECK(o.rdzv_host == "job-worker-0");
  CHECK(o.rdzv_port == 29400);
  CHECK(o.max_restarts == 3);
  CHECK(o.last_call_s == 5);
  CHECK(o.rdzv_timeout_s == 60);
  CHECK(o.nnodes == 1);  // PET_NNODES is cluster detection's (resolve_launch)
  CHECK(o.nproc_per_node == 1);
  CHECK_FALSE(o.was_given("--nnodes"));
  CHECK(o.was_given("--max-restarts"));
  REQUIRE_FALSE(o.notes.empty());
  CHECK(o.notes[0] ==
        "from the environment (torchrun's PET_* defaults): PET_RDZV_BACKEND=c10d, "
        "PET_RDZV_ENDPOINT=job-worker-0:29400, PET_RDZV_CONF=last_call_timeout=5,join_timeout=60, "
        "PET_MAX_RESTARTS=3");
  CHECK(o.program == std::vector<std::string>{"p"});

  SECTION("a flag on the command line wins over its variable; --rdzv-conf replaces, not adds") {
    const CliOptions c = parse_cli({"--max_restarts", "1", "--rdzv-conf", "join_timeout=7", "p"}, lookup(elastic));
    CHECK(c.max_restarts == 1);
    CHECK(c.rdzv_timeout_s == 7);
    CHECK(c.last_call_s == 30);  // PET_RDZV_CONF's last_call_timeout=5 is not read
    CHECK(c.notes[0].find("PET_MAX_RESTARTS") == std::string::npos);
    CHECK(c.notes[0].find("PET_RDZV_CONF") == std::string::npos);
  }
  SECTION("switches: a non-zero integer is on, 0 off; empty variables are unset") {
    CHECK(parse_cli({"p"}, lookup({{"PET_STANDALONE", "1"}})).standalone);
    CHECK_FALSE(parse_cli({"p"}, lookup({{"PET_STANDALONE", "0"}})).standalone);
    CHECK(parse_cli({"p"}, lookup({{"PET_NO_PYTHON", "2"}})).program_convention.no_python);
    CHECK(parse_cli({"p"}, lookup({{"PET_MODULE", "1"}})).program_convention.module);
    CHECK_FALSE(parse_cli({"p"}, lookup({{"PET_STANDALONE", ""}, {"PET_MAX_RESTARTS", ""}})).standalone);
    CHECK(parse_cli({"p"}, lookup({{"PET_MAX_RESTARTS", ""}})).notes.empty());
    CHECK(env_msg({"p"}, {{"PET_STANDALONE", "yes"}}) ==
          "PET_STANDALONE='yes': expected an integer (torchrun's switch --standalone: 0 off, any other integer on)");
  }
  SECTION("start method, log dir, role, std specs") {
    const CliOptions c = parse_cli({"p"}, lookup({{"PET_START_METHOD", "spawn"},
                                                  {"PET_LOG_DIR", "/tmp/l"},
                                                  {"PET_ROLE", "trainer"},
                                                  {"PET_TEE", "3"},
                                                  {"PET_REDIRECTS", "0:1"}}));
    CHECK(c.start_method == lspawn::CliStartMethod::Exec);
    CHECK(c.log_dir == "/tmp/l");
    CHECK(c.role == "trainer");
    REQUIRE(c.tee_spec);
    CHECK(c.tee_spec->all == 3);
    REQUIRE(c.redirects);
    CHECK(c.redirects->mask_for(0) == 1);
    CHECK(parse_cli({"--warm", "p"}, lookup({{"PET_START_METHOD", "spawn"}})).start_method ==
          lspawn::CliStartMethod::Warm);
  }
  SECTION("a bad value is named by its variable; a clash with the command line names both") {
    CHECK(env_msg({"p"}, {{"PET_MAX_RESTARTS", "many"}}) ==
          "PET_MAX_RESTARTS='many' (torchrun's environment default of --max-restarts): --max-restarts: expected an "
          "integer >= 0 (--max-restarts K), got 'many'");
    CHECK(env_msg({"p"}, {{"PET_RDZV_BACKEND", "etcd-v2"}})
              .find("PET_RDZV_BACKEND='etcd-v2' (torchrun's environment default of --rdzv-backend): --rdzv-backend: "
                    "lspawn's own "
                    "rendezvous replaces c10d and static") == 0);
    // --standalone (flag or variable) replaces the rendezvous: PET_RDZV_ENDPOINT/BACKEND are not read.
    for (const auto& [args, env] : std::vector<std::pair<std::vector<std::string>, Env>>{
             {{"--standalone", "p"}, elastic}, {{"p"}, [&] {
                                                  Env e = elastic;
                                                  e["PET_STANDALONE"] = "1";
                                                  return e;
                                                }()}}) {
      const CliOptions c = parse_cli(args, lookup(env));
      CHECK(c.standalone);
      CHECK(c.rdzv_endpoint.empty());
      CHECK(std::count(
                c.notes.begin(), c.notes.end(),
                "PET_RDZV_ENDPOINT='job-worker-0:29400': ignored with --standalone (one node, a local rendezvous)") ==
            1);
    }
    CHECK(env_msg({"--rdzv-endpoint", "h:1", "p"}, {{"PET_STANDALONE", "1"}}) ==
          "--standalone: cannot be combined with --rdzv-endpoint h:1 (--standalone is one node with a local "
          "rendezvous on a free port) (with PET_STANDALONE=1 from the environment)");
    CHECK(env_msg({"--help"}, {{"PET_MAX_RESTARTS", "many"}}) == "(accepted)");
  }
  SECTION("variables of torchrun flags lspawn does not have are noted, not read") {
    const CliOptions c = parse_cli({"p"}, lookup({{"PET_EVENT_LOG_HANDLER", "null"}}));
    REQUIRE(c.notes.size() == 1);
    CHECK(c.notes[0] ==
          "PET_EVENT_LOG_HANDLER='null': ignored (torchrun's --event-log-handler, which lspawn does not have)");
  }
  SECTION(
      "torchrun 2.15's last four: PET_SHUTDOWN_TIMEOUT, PET_LOG_LINE_PREFIX_TEMPLATE, PET_DUPLICATE_*_FILTERS, "
      "PET_VIRTUAL_LOCAL_RANK") {
    const CliOptions c = parse_cli({"p"}, lookup({{"PET_SHUTDOWN_TIMEOUT", "7"},
                                                  {"PET_LOG_LINE_PREFIX_TEMPLATE", "${rank}: "},
                                                  {"PET_DUPLICATE_STDOUT_FILTERS", "loss,,acc"},
                                                  {"PET_DUPLICATE_STDERR_FILTERS", "Error,Traceback"},
                                                  {"PET_VIRTUAL_LOCAL_RANK", "1"}}));
    CHECK(c.grace_period_s == 7);
    CHECK(c.log_line_prefix_template == "${rank}: ");
    CHECK(c.duplicate_filters[0] == std::vector<std::string>{"loss,acc"});
    CHECK(c.duplicate_filters[1] == std::vector<std::string>{"Error", "Traceback"});
    CHECK(c.virtual_local_rank);
    CHECK_FALSE(parse_cli({"p"}, lookup({{"PET_VIRTUAL_LOCAL_RANK", "0"}})).virtual_local_rank);
    CHECK(
        env_msg({"p"}, {{"PET_SHUTDOWN_TIMEOUT", "-1"}})
            .find(
                "PET_SHUTDOWN_TIMEOUT='-1' (torchrun's environment default of --shutdown-timeout): --shutdown-timeout: "
                "expected an integer number of seconds >= 0") == 0);
  }
  SECTION(
      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT is torchrun's fallback - --grace-period or --shutdown-timeout on the "
      "command line wins over both") {
    CHECK(parse_cli({"p"}, lookup({{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}})).grace_period_s == 9);
    CHECK(parse_cli({"p"}, lookup({{"PET_NUMA_BINDING", "socket"}})).numa_binding == "socket");
    CHECK(parse_cli({"--numa-binding", "node", "p"}, lookup({{"PET_NUMA_BINDING", "socket"}})).numa_binding == "node");
    CHECK(parse_cli({"p"}, lookup({{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}, {"PET_SHUTDOWN_TIMEOUT", "3"}}))
              .grace_period_s == 3);
    CHECK(parse_cli({"--grace-period", "0.5", "p"},
                    lookup({{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}, {"PET_SHUTDOWN_TIMEOUT", "3"}}))
              .grace_period_s == 0.5);
    CHECK(parse_cli({"--shutdown-timeout", "2", "p"}, lookup({{"PET_SHUTDOWN_TIMEOUT", "3"}})).grace_period_s == 2);
    CHECK(env_msg({"p"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}})
              .find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='soon' (torchrun's environment default of --shutdown-timeout)") ==
          0);
  }
}

TEST_CASE(
    "parse_cli: --shutdown-timeout, --log-line-prefix-template, --duplicate-std{out,err}-filters, "
    "--virtual-local-rank (torchrun 2.15's)",
    "[cli][torchrun]") {
  auto usage_of = [](const std::vector<std::string>& args) -> std::string {
    try {
      parse_cli(args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const CliOptions o = parse_cli({"--shutdown_timeout=12", "--log_line_prefix_template",
                                  "[${role_name}${local_rank}]:", "--duplicate-stdout-filters", "loss",
                                  "--duplicate_stderr_filters=a,,b,c", "--virtual_local_rank", "p"});
  CHECK(o.grace_period_s == 12);
  CHECK(o.log_line_prefix_template == "[${role_name}${local_rank}]:");
  CHECK(o.duplicate_filters[0] == std::vector<std::string>{"loss"});
  CHECK(o.duplicate_filters[1] == std::vector<std::string>{"a,b", "c"});
  CHECK(o.virtual_local_rank);
  const CliOptions d = parse_cli({"p"});
  CHECK(d.log_line_prefix_template.empty());
  CHECK(d.duplicate_filters[0].empty());
  CHECK_FALSE(d.virtual_local_rank);
  CHECK(parse_cli({"--duplicate-stdout-filters=", "p"}).duplicate_filters[0].empty());  // torchrun: no filter
  CHECK(usage_of({"--shutdown-timeout", "1.5", "p"}) ==
        "--shutdown-timeout: expected an integer number of seconds >= 0 (--shutdown-timeout SECONDS), got '1.5'");
  CHECK(usage_of({"--shutdown-timeout", "3", "--grace-period", "3", "p"})
            .find("--shutdown-timeout: cannot be combined with --grace-period") == 0);
  CHECK(usage_of({"--log-line-prefix-template", "${rank}", "--no-prefix", "p"})
            .find("--log-line-prefix-template: cannot be combined with --no-prefix") == 0);
  CHECK(usage_of({"--duplicate-stdout-filters", "loss,", "p"}) ==
        "--duplicate-stdout-filters: an empty filter in 'loss,' would copy every line (--duplicate-stdout-filters "
        "ERROR,Traceback; ',,' for a comma inside a filter)");
  CHECK(usage_of({"--virtual-local-rank=1", "p"}) ==
        "--virtual-local-rank: takes no value (--virtual-local-rank), got '1'");
}

TEST_CASE("expand_prefix_template: Python's Template.safe_substitute with torchrun's four fields", "[cli][torchrun]") {
  const lspawn::PrefixFields f{"trainer", 5, 1, "node7"};
  using lspawn::expand_prefix_template;
  CHECK(expand_prefix_template("[${role_name}${local_rank}]:", f) == "[trainer1]:");
  CHECK(expand_prefix_template("${hostname}:${rank}: ", f) == "node7:5: ");
  CHECK(expand_prefix_template("$rank/$local_rank ", f) == "5/1 ");
  CHECK(expand_prefix_template("$ranks", f) == "$ranks");  // identifier "ranks": unknown, kept
  CHECK(expand_prefix_template("${rank}s", f) == "5s");
  CHECK(expand_prefix_template("$$${rank} $", f) == "$5 $");               // "$$" is "$"; a last '$' stays
  CHECK(expand_prefix_template("${nope} ${rank", f) == "${nope} ${rank");  // unknown, unclosed: kept
  CHECK(expand_prefix_template("$1 ${ rank}", f) == "$1 ${ rank}");
  CHECK(expand_prefix_template("no fields", f) == "no fields");
  CHECK(expand_prefix_template("", f).empty());
}

TEST_CASE("parse_cli: torchrun flags lspawn does not support get their own error, not 'unknown option'",
          "[cli][torchrun]") {
  struct Case {
    std::vector<std::string> args;
    std::string start;
  };
  const std::vector<Case> cases = {
      {{"--logs-specs", "x", "p"}, "--logs-specs: torchrun's flag is not supported by lspawn ("},
      {{"--logs_specs=x", "p"}, "--logs-specs: torchrun's flag is not supported by lspawn ("},
      {{"--numa-binding", "nodes", "p"},
       "--numa-binding: 'nodes' is not a mode (node, socket, exclusive or core-complex, as torchrun)"},
      {{"--event_log_handler", "null", "p"}, "--event-log-handler: torchrun's flag is not supported by lspawn"},
  };
  for (const auto& c : cases) {
    INFO(c.args[0]);
    const std::string m = usage_msg(c.args);
    CHECK(m.find(c.start) == 0);
    CHECK(m.find("unknown option") == std::string::npos);
  }
  CHECK(usage_msg({"--no-such-flag", "p"}) == "--no-such-flag: unknown option (see lspawn --help)");
}
