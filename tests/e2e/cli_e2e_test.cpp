// lspawn's command line: usage errors, --help/--version, programs that cannot run, the port.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <sched.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.hpp"
#include "support/gpu.hpp"
#include "support/loopback.hpp"

using namespace lspawn::test;

namespace {
// `flags` before /bin/echo started: lspawn exits 2 saying `says`, and nothing was started.
void check_refused(const std::vector<std::string>& flags, const std::string& says,
                   const std::vector<std::string>& env = {}) {
  std::vector<std::string> args = flags;
  args.insert(args.end(), {"/bin/echo", "started"});
  const RunResult r = run_lspawn(args, env);
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(has(r.err, says));
  CHECK_FALSE(has(r.out, "started"));
}
}  // namespace

TEST_CASE("usage errors exit 2 - name the option and start nothing", "[e2e][cli]") {
  TempDir dir;
  const std::string marker = dir.path + "/started";
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--nprocs", "abc"},
       "--nprocs: expected a positive integer, gpu, cpu or auto (--nprocs N|gpu|cpu|auto), got 'abc'"},
      {{"--nproc_per_node=gpus"},
       "--nproc-per-node: expected a positive integer, gpu, cpu or auto (--nproc-per-node N|gpu|cpu|auto), got 'gpus'"},
      {{"--redirects", "5"}, "--redirects: expected 0 none, 1 stdout, 2 stderr, 3 both"},
      {{"--tee=all"}, "--tee: expected 0 none, 1 stdout, 2 stderr, 3 both"},
      {{"--standalone", "--rdzv-endpoint", "h:5"}, "--standalone: cannot be combined with --rdzv-endpoint h:5"},
      {{"--rdzv-backend", "etcd"}, "--rdzv-backend: lspawn's own rendezvous replaces c10d and static"},
      {{"--numa-binding", "rack"}, "--numa-binding: 'rack' is not a mode"},
      {{"--local_ranks_filter=0,b"}, "--local-ranks-filter: expected local ranks separated by commas"},
      {{"--nnodes", "1:2"}, "--nnodes 1:2: an elastic range needs --rdzv-endpoint HOST:PORT"},
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
    CHECK(r.err.find("--nprocs: missing value (--nprocs N|gpu|cpu|auto)") != std::string::npos);
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
  LoopbackListener taken(4);
  const std::string port = taken.port_text();
  TempDir dir;
  const std::string marker = dir.path + "/started";
  auto r = run_lspawn({"--master-port", port, worker_bin(), "touch", marker});
  taken.close();
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

// ---- torchrun's command line (docs/cli.md "From torchrun") ----

namespace {
int cpus_of_this_process() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  return CPU_COUNT(&set);
}
// A shell script printing "out RANK" on stdout and "err RANK" on stderr.
std::string out_err_script(const TempDir& dir) {
  const std::string path = dir.path + "/out_err.sh";
  write_file(path, "#!/bin/sh\necho \"out $RANK\"\necho \"err $RANK\" >&2\n", 0755);
  return path;
}
// Both log files of each of the first `ranks` ranks hold what out_err_script printed there.
void check_rank_logs(const std::string& logs, int ranks) {
  for (int rank = 0; rank < ranks; ++rank) {
    const std::string n = std::to_string(rank);
    CHECK(read_file(logs + "/rank" + n + ".stdout") == "out " + n + "\n");
    CHECK(read_file(logs + "/rank" + n + ".stderr") == "err " + n + "\n");
  }
}
}  // namespace

TEST_CASE("option --nproc-per-node auto/cpu: one worker per CPU this process may use (WORLD_SIZE)",
          "[e2e][cli][torchrun]") {
  const int cpus = cpus_of_this_process();
  for (const std::string spelling : {"--nproc-per-node=auto", "--nproc_per_node=cpu"}) {
    // CUDA_VISIBLE_DEVICES='' hides any GPU: auto is the CPUs on every machine.
    auto r = run_lspawn({spelling, worker_bin(), "env"}, {"CUDA_VISIBLE_DEVICES="});
    INFO(spelling << " ; stderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(count(r.out, "] WORLD_SIZE=" + std::to_string(cpus) + "\n") == cpus);
    CHECK(count(r.out, "] LOCAL_WORLD_SIZE=" + std::to_string(cpus) + "\n") == cpus);
    CHECK(count(r.out, "] RANK=") == cpus);
    CHECK(has(r.err, ": " + std::to_string(cpus) + " worker"));
  }
}

TEST_CASE("option --nproc-per-node gpu without a visible GPU: exit 2 naming the flag, nothing started",
          "[e2e][cli][torchrun]") {
  TempDir dir;
  const std::string marker = dir.path + "/started";
  auto r = run_lspawn({"--nproc-per-node", "gpu", worker_bin(), "touch", marker}, {"CUDA_VISIBLE_DEVICES="});
  CHECK(r.exit_code == 2);
  CHECK(has(r.err, "lspawn: --nproc-per-node gpu: no NVIDIA GPU is visible to this process (CUDA_VISIBLE_DEVICES='')"));
  CHECK(access(marker.c_str(), F_OK) != 0);
  if (!machine_has_nvidia_gpu() && getenv("CUDA_VISIBLE_DEVICES") == nullptr) {
    // This machine has none: the same without the variable.
    r = run_lspawn({"--nproc-per-node", "gpu", worker_bin(), "touch", marker});
    CHECK(r.exit_code == 2);
    CHECK(has(r.err, "--nproc-per-node gpu: no NVIDIA GPU is visible to this process (CUDA_VISIBLE_DEVICES unset"));
    CHECK(access(marker.c_str(), F_OK) != 0);
  }
}

TEST_CASE("option --standalone runs a one-node job on a free port, even inside a Slurm step", "[e2e][cli][torchrun]") {
  // A Slurm step of 2 nodes: without --standalone lspawn would be node 1 of 2.
  const std::vector<std::string> slurm = {"SLURM_JOB_ID=42",
                                          "SLURM_STEP_ID=0",
                                          "SLURM_NNODES=2",
                                          "SLURM_NODEID=1",
                                          "SLURM_STEP_NODELIST=n[01-02]",
                                          "SLURM_STEP_TASKS_PER_NODE=1(x2)",
                                          "MASTER_PORT=1"};
  auto r = run_lspawn({"--standalone", "--nproc_per_node", "2", worker_bin(), "env"}, slurm);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(count(r.out, "] WORLD_SIZE=2\n") == 2);
  CHECK(count(r.out, "] GROUP_RANK=0\n") == 2);
  CHECK(count(r.out, "] MASTER_ADDR=127.0.0.1\n") == 2);
  CHECK_FALSE(has(r.out, "MASTER_PORT=1\n"));
  CHECK_FALSE(has(r.err, "Slurm job 42"));
}

TEST_CASE("a .py program runs under Python -u ($LSPAWN_PYTHON) with its arguments", "[e2e][cli][torchrun][exec-only]") {
  if (access("/usr/bin/python3", X_OK) != 0) {
    WARN("no /usr/bin/python3: not tested");
    return;
  }
  TempDir dir;
  const std::string script = dir.path + "/print_rank.py";
  write_file(script,
             "import os, sys\nprint('py rank', os.environ['RANK'], 'unbuffered', int('-u' in sys.orig_argv), "
             "'args', sys.argv[1:])\n");
  auto r = run_lspawn({"--nproc-per-node", "2", script, "--lr", "1"}, {"LSPAWN_PYTHON=/usr/bin/python3"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "[rank 0] py rank 0 unbuffered 1 args ['--lr', '1']\n"));
  CHECK(has(r.out, "[rank 1] py rank 1 unbuffered 1 args ['--lr', '1']\n"));
  CHECK(has(r.err, "lspawn: running /usr/bin/python3 -u " + script + " ... (a .py program; Python: $LSPAWN_PYTHON"));
  // A missing script: 127 before anything starts.
  r = run_lspawn({dir.path + "/missing.py"}, {"LSPAWN_PYTHON=/usr/bin/python3"});
  CHECK(r.exit_code == 127);
  CHECK(has(r.err, "lspawn: cannot open the Python program '" + dir.path + "/missing.py': No such file or directory"));
}

TEST_CASE("torchrun's --start-method forkserver (or PET_START_METHOD) with a Python program: run by exec, with a note",
          "[e2e][cli][torchrun][exec-only]") {
  if (access("/usr/bin/python3", X_OK) != 0) {
    WARN("no /usr/bin/python3: not tested");
    return;
  }
  TempDir dir;
  const std::string script = dir.path + "/print_rank.py";
  write_file(script, "import os\nprint('py rank', os.environ['RANK'])\n");
  const std::string note =
      "lspawn: --start-method forkserver: a Python program runs by exec, as torchrun runs scripts "
      "whatever its start method; to fork the workers from one interpreter that imported torch "
      "once: --preload torch\n";
  for (const auto& [args, env] : std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>{
           {{"--nproc-per-node", "2", "--start-method", "forkserver", script}, {"LSPAWN_PYTHON=/usr/bin/python3"}},
           {{"--nproc-per-node", "2", "/usr/bin/python3", script}, {"PET_START_METHOD=forkserver"}}}) {
    auto r = run_lspawn(args, env);
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK(has(r.out, "[rank 0] py rank 0"));
    CHECK(has(r.out, "[rank 1] py rank 1"));
    CHECK(has(r.err, note));
  }
  // A program that is no interpreter still needs lspawn's hook (forkserver_e2e_test.cpp).
  auto r = run_lspawn({"--start-method", "forkserver", "/bin/true"});
  CHECK(r.exit_code == 2);
}

TEST_CASE("option -m/--module runs python -u -m MODULE", "[e2e][cli][torchrun][exec-only]") {
  if (access("/usr/bin/python3", X_OK) != 0) {
    WARN("no /usr/bin/python3: not tested");
    return;
  }
  TempDir dir;
  write_file(dir.path + "/lspawn_e2e_mod.py",
             "import os, sys\nprint('module', __name__, 'rank', os.environ['RANK'], sys.argv[1:])\n");
  const std::vector<std::string> env = {"LSPAWN_PYTHON=/usr/bin/python3", "PYTHONPATH=" + dir.path};
  for (const std::string flag : {"-m", "--module"}) {
    auto r = run_lspawn({"--nproc-per-node=2", flag, "lspawn_e2e_mod", "x"}, env);
    INFO(flag << " ; stderr: " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(has(r.out, "[rank 0] module __main__ rank 0 ['x']\n"));
    CHECK(has(r.out, "[rank 1] module __main__ rank 1 ['x']\n"));
  }
}

TEST_CASE("option --no-python execs a .py program directly - other programs are exec'd as before",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string script = dir.path + "/shell.py";  // a shell script named .py: Python would fail on it
  write_file(script, "#!/bin/sh\necho \"direct $RANK $1\"\n", 0755);
  auto r =
      run_lspawn({"--quiet", "--no-python", "--nproc-per-node", "2", script, "a"}, {"LSPAWN_PYTHON=/usr/bin/python3"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "[rank 0] direct 0 a\n"));
  CHECK(has(r.out, "[rank 1] direct 1 a\n"));
  if (access("/usr/bin/python3", X_OK) == 0) {  // the control: without the flag Python runs it (and fails)
    r = run_lspawn({"--quiet", script, "a"}, {"LSPAWN_PYTHON=/usr/bin/python3"});
    CHECK(r.exit_code != 0);
    CHECK_FALSE(has(r.out, "direct"));
  }
  r = run_lspawn({"--no-python", "-m", "mod"});
  CHECK(r.exit_code == 2);
  CHECK(has(r.err, "--no-python: cannot be combined with -m/--module"));
}

TEST_CASE("option --redirects 3 --log-dir D: output in the files and not on the console",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  auto r = run_lspawn({"--quiet", "--nproc_per_node", "2", "--redirects", "3", "--log-dir", logs, out_err_script(dir)});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  check_rank_logs(logs, 2);
  CHECK_FALSE(has(r.out, "out "));
  CHECK_FALSE(has(r.err, "err "));
}

TEST_CASE("option --tee 3 --log-dir D: output in the files and on the console", "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  auto r = run_lspawn({"--quiet", "--nproc-per-node=2", "--tee", "3", "--log-dir=" + logs, out_err_script(dir)});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  check_rank_logs(logs, 2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string n = std::to_string(rank);
    CHECK(has(r.out, "[rank " + n + "] out " + n + "\n"));
    CHECK(has(r.err, "[rank " + n + "] err " + n + "\n"));
  }
}

TEST_CASE("options -r/-t per local rank: -r 0:3 -t 1:1 - the rest on the console only",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  auto r = run_lspawn({"--quiet", "--nproc-per-node=3", "-r", "0:3", "-t1:1", "--log-dir", logs, out_err_script(dir)});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  // rank 0: both streams to the files only
  CHECK(read_file(logs + "/rank0.stdout") == "out 0\n");
  CHECK(read_file(logs + "/rank0.stderr") == "err 0\n");
  CHECK_FALSE(has(r.out, "out 0"));
  CHECK_FALSE(has(r.err, "err 0"));
  // rank 1: stdout to the file and the console, stderr to the console only
  CHECK(read_file(logs + "/rank1.stdout") == "out 1\n");
  CHECK(has(r.out, "[rank 1] out 1\n"));
  CHECK(has(r.err, "[rank 1] err 1\n"));
  CHECK(access((logs + "/rank1.stderr").c_str(), F_OK) != 0);
  // rank 2: the console only
  CHECK(has(r.out, "[rank 2] out 2\n"));
  CHECK(has(r.err, "[rank 2] err 2\n"));
  CHECK(access((logs + "/rank2.stdout").c_str(), F_OK) != 0);
}

TEST_CASE("options --redirects 3 --tee 0:1: tee wins over redirect for the streams it names",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  auto r = run_lspawn(
      {"--quiet", "--nproc-per-node=2", "--redirects", "3", "--tee", "0:1", "--log-dir", logs, out_err_script(dir)});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  check_rank_logs(logs, 2);               // every stream in the files
  CHECK(has(r.out, "[rank 0] out 0\n"));  // tee'd: the console too
  CHECK_FALSE(has(r.err, "err 0"));       // redirected only
  CHECK_FALSE(has(r.out, "out 1"));
  CHECK_FALSE(has(r.err, "err 1"));
}

// The log directory lspawn named on stderr after `needle` (its --redirects/--tee or
// --local-ranks-filter line), or "".
std::string named_log_dir(const std::string& err, const std::string& needle) {
  const auto at = err.find(needle);
  if (at == std::string::npos) return "";
  return err.substr(at + needle.size(), err.find(' ', at + needle.size()) - at - needle.size());
}

TEST_CASE("option --redirects without --log-dir: a temporary log directory, named", "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  auto r = run_lspawn({"--redirects", "1", out_err_script(dir)}, {"TMPDIR=" + dir.path});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string logs = named_log_dir(r.err, "--redirects/--tee without --log-dir: the log files are in ");
  REQUIRE(logs.rfind(dir.path + "/lspawn-logs-", 0) == 0);
  CHECK(read_file(logs + "/rank0.stdout") == "out 0\n");
  CHECK_FALSE(has(r.out, "out 0"));
  CHECK(has(r.err, "[rank 0] err 0\n"));
}

TEST_CASE(
    "option --local-ranks-filter 0 without --log-dir: local rank 0 on the console, the others in a temporary log "
    "directory, named",
    "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  auto r =
      run_lspawn({"--nproc-per-node", "3", "--local-ranks-filter", "0", out_err_script(dir)}, {"TMPDIR=" + dir.path});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  const std::string logs = named_log_dir(r.err, "--local-ranks-filter without --log-dir: the log files are in ");
  REQUIRE(logs.rfind(dir.path + "/lspawn-logs-", 0) == 0);
  CHECK(has(r.out, "[rank 0] out 0\n"));
  CHECK(has(r.err, "[rank 0] err 0\n"));
  CHECK(access((logs + "/rank0.stdout").c_str(), F_OK) != 0);  // shown, neither redirected nor tee'd
  for (int rank = 1; rank < 3; ++rank) {                       // torchrun: /dev/null; lspawn: the files
    const std::string n = std::to_string(rank);
    CHECK_FALSE(has(r.out, "out " + n));
    CHECK_FALSE(has(r.err, "err " + n));
    CHECK(read_file(logs + "/rank" + n + ".stdout") == "out " + n + "\n");
    CHECK(read_file(logs + "/rank" + n + ".stderr") == "err " + n + "\n");
  }
}

TEST_CASE(
    "options --local-ranks-filter 0 --role rank --tee 3 --log-dir D (torchtitan's): every rank in the files, rank 0 on "
    "the console too",
    "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  auto r = run_lspawn({"--quiet", "--nproc-per-node=2", "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
                       "--log-dir", logs, out_err_script(dir)});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  check_rank_logs(logs, 2);
  CHECK(has(r.out, "[rank 0] out 0\n"));
  CHECK(has(r.err, "[rank 0] err 0\n"));
  CHECK_FALSE(has(r.out, "out 1"));
  CHECK_FALSE(has(r.err, "err 1"));
}

TEST_CASE("option --local-ranks-filter: a hidden rank that fails is the root cause, and the report names its log files",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  const std::string script = dir.path + "/fail1.sh";
  write_file(script, "#!/bin/sh\n[ \"$RANK\" = 1 ] && { echo \"rank 1 gives up\" >&2; exit 7; }\nsleep 30\n", 0755);
  auto r = run_lspawn({"--nproc-per-node=2", "--local-ranks-filter", "0", "--log-dir", logs, script});
  INFO(r.err);
  CHECK(r.exit_code == 7);
  CHECK(has(r.err, "root cause: process 1 terminated with exit code 7"));
  CHECK(has(r.err, "its output, not on the console: " + logs + "/rank1.stdout, " + logs + "/rank1.stderr\n"));
  CHECK_FALSE(has(r.err, "rank 1 gives up"));
  CHECK(read_file(logs + "/rank1.stderr") == "rank 1 gives up\n");
}

TEST_CASE("option --local-ranks-filter naming a local rank this node does not have: exit 2, naming it, nothing started",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string marker = dir.path + "/started";
  auto r = run_lspawn({"--nproc-per-node", "2", "--local-ranks-filter", "0,2", "sh", "-c", "touch " + marker});
  CHECK(r.exit_code == 2);
  CHECK(has(r.err, "--local-ranks-filter: local rank 2 does not exist: each node has 2 workers, local ranks 0..1"));
  CHECK(access(marker.c_str(), F_OK) != 0);
}

TEST_CASE("lspawn's own --tee (no spec after it) still means: with --log-dir, the console too",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  auto r = run_lspawn({"--quiet", "--log-dir", logs, "--tee", out_err_script(dir)});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(read_file(logs + "/rank0.stdout") == "out 0\n");
  CHECK(has(r.out, "[rank 0] out 0\n"));
}

TEST_CASE("option --role sets ROLE_NAME - harmless torchrun flags are accepted with a note", "[e2e][cli][torchrun]") {
  auto r = run_lspawn({"--role", "trainer", "--monitor_interval=0.1", "--rdzv-backend", "c10d", "--rdzv_conf",
                       "join_timeout=60,read_timeout=5", "--max_restarts", "0", worker_bin(), "env"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "[rank 0] ROLE_NAME=trainer\n"));
  CHECK(has(r.err, "lspawn: --monitor-interval: ignored"));
  CHECK(has(r.err, "lspawn: --rdzv-conf: ignored read_timeout"));
}

TEST_CASE(
    "option --log-line-prefix-template (or PET_LOG_LINE_PREFIX_TEMPLATE): each console line starts with the "
    "rank's expansion of torchrun's fields",
    "[e2e][cli][torchrun][exec-only]") {
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof host - 1) == 0);
  const std::vector<std::string> program = {"/bin/sh", "-c", "echo out; echo err >&2"};
  std::vector<std::string> args = {"--nprocs",
                                   "2",
                                   "--role",
                                   "trainer",
                                   "--log-line-prefix-template",
                                   "[${role_name}${local_rank}|${rank}@${hostname}]:"};
  args.insert(args.end(), program.begin(), program.end());
  auto r = run_lspawn(args);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, std::string("[trainer0|0@") + host + "]:out\n"));
  CHECK(has(r.out, std::string("[trainer1|1@") + host + "]:out\n"));
  CHECK(has(r.err, std::string("[trainer1|1@") + host + "]:err\n"));
  CHECK_FALSE(has(r.out, "[rank "));
  args = {"--nprocs", "2"};
  args.insert(args.end(), program.begin(), program.end());
  r = run_lspawn(args, {"PET_LOG_LINE_PREFIX_TEMPLATE=$rank> "});
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "0> out\n"));
  CHECK(has(r.out, "1> out\n"));
  CHECK(has(r.err, "PET_LOG_LINE_PREFIX_TEMPLATE=$rank> "));
  check_refused({"--no-prefix", "--log-line-prefix-template", "${rank}"},
                "--log-line-prefix-template: cannot be combined with --no-prefix");
}

TEST_CASE(
    "options --duplicate-stdout-filters/--duplicate-stderr-filters: matching lines of every rank, prefixed, in "
    "LOG_DIR/filtered_std{out,err}.log - each restart attempt its own",
    "[e2e][cli][torchrun][exec-only]") {
  TempDir dir;
  const std::string logs = dir.path + "/logs";
  // Rank 1 fails on attempt 0 after its lines; attempt 1 succeeds.
  const std::string script =
      "a=$TORCHELASTIC_RESTART_COUNT; echo \"loss=$RANK.$a\"; echo \"step $RANK\"; echo \"Error, rank $RANK\" >&2; "
      "echo \"warning $RANK\" >&2; if [ $RANK = 1 ] && [ $a = 0 ]; then exit 3; fi";
  auto r = run_lspawn({"--nprocs", "2", "--max-restarts", "1", "--log-dir", logs, "--tee", "--duplicate-stdout-filters",
                       "loss=", "--duplicate_stderr_filters=Error,,,nothing", "/bin/sh", "-c", script});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string a0 = read_file(logs + "/filtered_stdout.log");
  CHECK(has(a0, "[rank 1] loss=1.0\n"));
  CHECK_FALSE(has(a0, "step"));
  CHECK(has(read_file(logs + "/filtered_stderr.log"), "[rank 1] Error, rank 1\n"));
  const std::string a1 = read_file(logs + "/filtered_stdout.attempt1.log");
  CHECK(has(a1, "[rank 0] loss=0.1\n"));
  CHECK(has(a1, "[rank 1] loss=1.1\n"));
  CHECK(count(a1, "\n") == 2);
  const std::string e1 = read_file(logs + "/filtered_stderr.attempt1.log");
  CHECK(count(e1, "\n") == 2);
  CHECK_FALSE(has(e1, "warning"));
  // The console and the rank files are as without the filters.
  CHECK(has(r.out, "[rank 0] step 0\n"));
  CHECK(read_file(logs + "/rank0.attempt1.stdout") == "loss=0.1\nstep 0\n");
  // No --log-dir: a directory of their own, named; the console as ever.
  r = run_lspawn({"--nprocs", "2", "--duplicate-stdout-filters", "loss=", "/bin/sh", "-c", script});
  CHECK(r.exit_code == 3);
  const std::string said = "lspawn: --duplicate-stdout/stderr-filters without --log-dir: the filtered copies are in ";
  const auto at = r.err.find(said);
  REQUIRE(at != std::string::npos);
  const std::string own = r.err.substr(at + said.size(), r.err.find(" (kept after the run)", at) - at - said.size());
  CHECK(has(read_file(own + "/filtered_stdout.log"), "[rank 1] loss=1.0\n"));
  CHECK(access((own + "/filtered_stderr.log").c_str(), F_OK) != 0);
  CHECK(has(r.out, "[rank 1] loss=1.0\n"));
  REQUIRE(own.find("/lspawn-logs-") != std::string::npos);
  REQUIRE(std::filesystem::remove_all(own) > 0);  // lspawn kept it; the test removes it
  // An empty filter would match every line.
  check_refused({"--duplicate-stderr-filters", "Error,"},
                "--duplicate-stderr-filters: an empty filter in 'Error,' would copy every line");
}

TEST_CASE(
    "option --virtual-local-rank (or PET_VIRTUAL_LOCAL_RANK): LOCAL_RANK=0 and each worker's own entry of "
    "CUDA_VISIBLE_DEVICES - a list too short: exit 2, nothing started",
    "[e2e][cli][torchrun][exec-only]") {
  const std::vector<std::string> program = {
      "/bin/sh", "-c", "echo \"rank=$RANK local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE cvd=$CUDA_VISIBLE_DEVICES\""};
  std::vector<std::string> args = {"--nprocs", "2", "--virtual-local-rank"};
  args.insert(args.end(), program.begin(), program.end());
  auto r = run_lspawn(args, {"CUDA_VISIBLE_DEVICES=5,7"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "[rank 0] rank=0 local=0 lws=2 cvd=5\n"));
  CHECK(has(r.out, "[rank 1] rank=1 local=0 lws=2 cvd=7\n"));
  CHECK(has(r.err,
            "--virtual-local-rank: each worker has LOCAL_RANK=0 and one visible device (local rank -> "
            "CUDA_VISIBLE_DEVICES): 0 -> 5, 1 -> 7\n"));
  args = {"--nprocs", "2"};
  args.insert(args.end(), program.begin(), program.end());
  r = run_lspawn(args, {"PET_VIRTUAL_LOCAL_RANK=1", "CUDA_VISIBLE_DEVICES=5,7"});
  CHECK(has(r.out, "[rank 1] rank=1 local=0 lws=2 cvd=7\n"));
  r = run_lspawn(args, {"CUDA_VISIBLE_DEVICES=5,7"});  // off: as ever
  CHECK(has(r.out, "[rank 1] rank=1 local=1 lws=2 cvd=5,7\n"));
  check_refused({"--nprocs", "2", "--virtual-local-rank"},
                "lspawn: --virtual-local-rank: local rank 1 has no device in CUDA_VISIBLE_DEVICES='5' (1 entry), "
                "for 2 workers per node\n",
                {"CUDA_VISIBLE_DEVICES=5"});
}

TEST_CASE("option --shutdown-timeout (or TORCH_ELASTIC_SHUTDOWN_TIMEOUT) is torchrun's name of the grace period",
          "[e2e][cli][torchrun][exec-only]") {
  TempDir sync;
  // Rank 0 fails once rank 1 has installed its SIG_IGN; rank 1 is killed after the timeout.
  const std::vector<std::string> program = {
      "/bin/sh", "-c",
      "if [ $RANK = 1 ]; then exec " + worker_bin() +
          " ignore-term; fi; until [ -e $LSPAWN_TEST_SYNC_DIR/ready-1 ]; do sleep 0.01; done; exit 5"};
  for (const auto& [flags, env] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--shutdown-timeout", "1"}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=30"},
           {{}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1"}}) {
    ::unlink((sync.path + "/ready-1").c_str());
    std::vector<std::string> args = {"--nprocs", "2"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), program.begin(), program.end());
    auto r = run_lspawn(args, {"LSPAWN_TEST_SYNC_DIR=" + sync.path, env});
    INFO(r.err);
    CHECK(r.exit_code == 5);
    CHECK(has(r.err, "grace period of 1 s is over"));
    CHECK(has(r.err, "terminated by lspawn with SIGKILL"));
  }
}
