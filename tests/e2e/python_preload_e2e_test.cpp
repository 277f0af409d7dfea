// `lspawn --preload MODULES python3 SCRIPT` end to end (docs/cli.md, launcher/python_preload.hpp,
// python/lspawn_preload.py): the built lspawn runs the unmodified scripts of
// tests/e2e/fixtures/preload/ under the Python of the LibTorch line under test, from one
// interpreter that imported torch, and each case compares with what exec mode does.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.hpp"
#include "support/gpu.hpp"
#include "launcher/cli_options.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {

const std::string kPython = test_python();
const std::string kDir = LSPAWN_PRELOAD_FIXTURES;
// The fixture modules (preload_thread_at_import, preload_main_pkg, ...) import from here.
const std::string kPythonPath = "PYTHONPATH=" + kDir;

std::string fixture(const std::string& name) { return kDir + "/" + name; }

// lspawn [--preload MODULES] --nprocs N PYTHON args..., to its exit (Python imports take seconds).
struct Run {
  int code = -1;
  std::string out, err;
};
// lspawn ARGS..., PYTHONPATH on the fixtures, to its exit (up to 180 s: Python imports take seconds).
Run run_job(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{lspawn_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> e{kPythonPath};
  e.insert(e.end(), env.begin(), env.end());
  Child c(argv, e);
  Run r;
  r.code = code_of(c.wait(180s));
  r.out = c.out();
  r.err = c.err();
  return r;
}
Run run(const std::vector<std::string>& lspawn_args, const std::vector<std::string>& python_args,
        const std::vector<std::string>& env = {}) {
  std::vector<std::string> args = lspawn_args;
  args.push_back(kPython);
  args.insert(args.end(), python_args.begin(), python_args.end());
  return run_job(args, env);
}

std::vector<std::string> sorted_lines(const std::string& text) {
  auto l = lines(text);
  std::sort(l.begin(), l.end());
  return l;
}

}  // namespace

TEST_CASE("python preload: an unmodified torch script (gloo all_reduce) prints what it prints in exec mode",
          "[e2e][python][preload]") {
  const Run exec = run({"--quiet", "--nprocs", "2"}, {fixture("allreduce.py"), "--lr", "0.1"});
  const Run pre = run({"--quiet", "--nprocs", "2", "--preload", "torch"}, {fixture("allreduce.py"), "--lr", "0.1"});
  INFO("exec:\n" << exec.out << exec.err << "\npreload:\n" << pre.out << pre.err);
  REQUIRE(exec.code == 0);
  CHECK(pre.code == 0);
  CHECK(count(pre.out, "sum 3.0 ok; __name__=__main__ file=allreduce.py argv=['--lr', '0.1'] path0=True") == 2);
  CHECK(has(pre.out, "[rank 1] rank 1/2: sum 3.0 ok"));
  CHECK(has(pre.out,
            "env_rank=1 local=1 world=2/2 error_file=error-1.json fds_var=False argv_var=False "
            "cuda_initialized=False"));
  CHECK(sorted_lines(pre.out) == sorted_lines(exec.out));
  CHECK(pre.err == exec.err);
}

TEST_CASE("python preload: a rank raising under @record is named with its Python exception, exit code as in exec",
          "[e2e][python][preload]") {
  const Run exec = run({"--nprocs", "2"}, {fixture("record_fail.py")});
  const Run pre = run({"--nprocs", "2", "--preload", "torch"}, {fixture("record_fail.py")});
  INFO("exec:\n" << exec.err << "\npreload:\n" << pre.err);
  REQUIRE(exec.code == 1);
  CHECK(pre.code == exec.code);
  for (const Run* r : {&exec, &pre}) {
    CHECK(has(r->err, "lspawn: root cause: process 1 terminated with exit code 1"));
    CHECK(has(r->err, "rank 1 of 2, pid "));
    CHECK(has(r->err, "ValueError: rank 1 fails on purpose"));
    CHECK(has(r->err, "record_fail.py\", line "));
    CHECK(!has(r->err, "error file: none written"));
  }
  CHECK(!has(pre.err, "lspawn_preload.py"));  // the runner's frames are not the script's
  CHECK(!has(pre.err, "runpy"));
  CHECK(has(pre.err, "[rank 1] Traceback (most recent call last):\n[rank 1]   File \"" + fixture("record_fail.py") +
                         "\", line 15, in <module>"));
}

TEST_CASE("python preload: sys.exit(3) in the script is the run's exit code 3", "[e2e][python][preload]") {
  const Run pre = run({"--nprocs", "2", "--preload", "torch"}, {fixture("exit3.py")});
  INFO(pre.out << pre.err);
  CHECK(pre.code == 3);
  CHECK(count(pre.out, "about to sys.exit(3)") >= 1);  // the first exit stops the other rank
  CHECK(has(pre.err, "terminated with exit code 3"));
}

TEST_CASE("python preload: SIGTERM or SIGINT to lspawn stops every worker", "[e2e][python][preload]") {
  const int sig = GENERATE(SIGTERM, SIGINT);
  INFO("signal " << sig);
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--grace-period", "2", "--preload", "torch", kPython, fixture("sleeper.py")},
          {kPythonPath});
  REQUIRE(c.wait_stdout_count("ready pid", 2, 60s));
  const auto pids = worker_pids(c.out());
  REQUIRE(pids.size() == 2);
  c.signal(sig);
  const int st = c.wait(30s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 128 + sig);
  CHECK(alive_after(pids, 5s).empty());
}

TEST_CASE("python preload: lspawn SIGKILLed leaves no worker and no server", "[e2e][python][preload]") {
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--preload", "torch", kPython, fixture("sleeper.py")}, {kPythonPath});
  REQUIRE(c.wait_stdout_count("ready pid", 2, 60s));
  const auto pids = worker_pids(c.out());
  REQUIRE(pids.size() == 2);
  c.signal(SIGKILL);
  c.wait(10s);
  CHECK(alive_after(pids, 5s).empty());
}

TEST_CASE("python preload: a module that starts a thread at import is refused, named, before any worker",
          "[e2e][python][preload]") {
  const Run r = run({"--nprocs", "2", "--preload", "torch,preload_thread_at_import"}, {fixture("sleeper.py")});
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK(has(r.err, "lspawn: --preload: "));
  CHECK(has(r.err,
            "refused: importing 'preload_thread_at_import' started 1 thread (threading: preload-fixture-thread); "
            "forking workers from it is unsafe"));
  CHECK(has(r.err, "(or set LSPAWN_PRELOAD_ALLOW_THREADS=1 to fork anyway)"));
  CHECK(!has(r.out, "ready pid"));
}

TEST_CASE(
    "python preload: a thread that is not Python's is refused with its name, and LSPAWN_PRELOAD_ALLOW_THREADS=1 forks "
    "anyway, warning",
    "[e2e][python][preload]") {
  const Run refused = run({"--nprocs", "2", "--preload", "preload_native_thread_at_import"}, {fixture("exit3.py")});
  INFO(refused.out << refused.err);
  CHECK(refused.code == 1);
  CHECK(has(refused.err,
            "refused: importing 'preload_native_thread_at_import' started 1 thread (not Python threads: "
            "fixture-native); forking workers from it is unsafe"));
  CHECK(!has(refused.out, "about to sys.exit(3)"));

  // One worker: with two, the first exit 3 stops the other (fail-fast) before it prints.
  const Run allowed = run({"--nprocs", "1", "--preload", "preload_native_thread_at_import"}, {fixture("exit3.py")},
                          {"LSPAWN_PRELOAD_ALLOW_THREADS=1"});
  INFO(allowed.out << allowed.err);
  CHECK(allowed.code == 3);  // the script's own exit code, reported although a thread of the server may take SIGCHLD
  CHECK(count(allowed.out, "about to sys.exit(3)") == 1);
  CHECK(has(allowed.err,
            "lspawn: --preload: importing 'preload_native_thread_at_import' started 1 thread (not Python "
            "threads: fixture-native); forking workers anyway (LSPAWN_PRELOAD_ALLOW_THREADS=1)"));

  const Run bad = run({"--nprocs", "2", "--preload", "preload_native_thread_at_import"}, {fixture("exit3.py")},
                      {"LSPAWN_PRELOAD_ALLOW_THREADS=yes"});
  INFO(bad.out << bad.err);
  CHECK(bad.code == 1);
  CHECK(has(bad.err, "refused: LSPAWN_PRELOAD_ALLOW_THREADS='yes': expected 1 (fork anyway) or 0"));
  CHECK(!has(bad.out, "about to sys.exit(3)"));
}

TEST_CASE("python preload: jemalloc's background thread is fork-safe by jemalloc's own handlers, and accepted",
          "[e2e][python][preload]") {
  // On an H100 machine importing Lightning loads a library that starts one (docs/gpu.md). Here the
  // interpreter runs on Debian's jemalloc (scripts/install-deps.sh) with its background threads on.
  const std::string jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
  if (::access(jemalloc.c_str(), R_OK) != 0) {
    WARN("no " << jemalloc << " (bash scripts/install-deps.sh installs libjemalloc2)");
    return;
  }
  const char* sanitizer = std::getenv("LD_PRELOAD");  // ASan's runtime comes first when set
  const std::string preload = std::string(sanitizer && *sanitizer ? std::string(sanitizer) + " " : "") + jemalloc;
  const Run r = run({"--nprocs", "1", "--preload", "json"}, {fixture("server_threads.py")},
                    {"LD_PRELOAD=" + preload, "MALLOC_CONF=background_thread:true"});
  INFO(r.out << r.err);
  if (has(r.out, "server threads:") && !has(r.out, "jemalloc_bg_thd")) {
    WARN("jemalloc started no background thread under this build (a sanitizer's malloc comes first)");
    return;
  }
  CHECK(r.code == 0);
  CHECK(has(r.out, "server threads: "));  // then the interpreter's name ("python3", a venv's "python")
  CHECK(has(r.out, ",jemalloc_bg_thd"));
  CHECK(!has(r.err, "refused"));
}

TEST_CASE("python preload: a module that does not import is named with its error", "[e2e][python][preload]") {
  const Run missing = run({"--preload", "torch,no_such_module_for_lspawn"}, {fixture("exit3.py")});
  INFO(missing.err);
  CHECK(missing.code == 1);
  CHECK(has(missing.err,
            "refused: cannot import 'no_such_module_for_lspawn': ModuleNotFoundError: No module named "
            "'no_such_module_for_lspawn'"));
  const Run broken = run({"--preload", "preload_broken_at_import"}, {fixture("exit3.py")});
  INFO(broken.err);
  CHECK(broken.code == 1);
  CHECK(has(broken.err,
            "cannot import 'preload_broken_at_import': RuntimeError: preload_broken_at_import fails at "
            "import on purpose (raised at " +
                fixture("preload_broken_at_import.py") + ":1)"));
  CHECK(!has(missing.out + broken.out, "about to sys.exit(3)"));
}

TEST_CASE("python preload: usage errors (empty module name, not a Python, interpreter options, with exec) exit 2",
          "[e2e][python][preload]") {
  auto usage = [](const std::vector<std::string>& args, const std::string& says) {
    const RunResult r = run_lspawn(args);
    INFO(r.err);
    CHECK(r.exit_code == lspawn::exit_codes::kUsage);
    CHECK(has(r.err, says));
  };
  usage({"--preload", "torch,,numpy", kPython, "x.py"}, "--preload: an empty module name in 'torch,,numpy'");
  usage({"--preload", "", kPython, "x.py"}, "--preload: an empty module name");
  usage({"--preload", "torch", "/bin/echo", "hi"}, "--preload: '/bin/echo' is not a Python interpreter");
  usage({"--preload", "torch", kPython, "-u", "x.py"}, "--preload: the interpreter option '-u' is not supported");
  usage({"--preload", "torch", kPython}, "needs a script or -m MODULE");
  usage({"--preload", "torch", "--start-method", "exec", kPython, "x.py"}, "cannot be --start-method exec");
}

TEST_CASE("python preload: python3 -m MODULE ARGS runs the module as __main__, as in exec mode",
          "[e2e][python][preload]") {
  const Run exec = run({"--quiet", "--nprocs", "2"}, {"-m", "preload_main_pkg", "a", "b c"});
  const Run pre = run({"--quiet", "--nprocs", "2", "--preload", "torch"}, {"-m", "preload_main_pkg", "a", "b c"});
  INFO("exec:\n" << exec.out << exec.err << "\npreload:\n" << pre.out << pre.err);
  REQUIRE(exec.code == 0);
  CHECK(pre.code == 0);
  CHECK(count(pre.out, "__name__=__main__ argv=['a', 'b c'] argv0=__main__.py torch=True") == 2);
  CHECK(sorted_lines(pre.out) == sorted_lines(exec.out));
}

TEST_CASE("python preload: --warm reuses the daemon's preloaded interpreter, for another script too",
          "[e2e][python][preload][warm]") {
  Daemon d;
  std::vector<std::string> warm = d.warm_args();
  warm.insert(warm.end(), {"--nprocs", "2", "--preload", "torch"});
  const Run first = run(warm, {fixture("allreduce.py"), "one"});
  INFO(first.out << first.err);
  REQUIRE(first.code == 0);
  CHECK(has(first.err, "lspawn: new forkserver (pid "));
  CHECK(has(first.err, ", run 1) of the daemon"));
  CHECK(count(first.out, "sum 3.0 ok; __name__=__main__ file=allreduce.py argv=['one']") == 2);
  const Run second = run(warm, {fixture("allreduce.py"), "two"});
  INFO(second.out << second.err);
  CHECK(second.code == 0);
  CHECK(has(second.err, "lspawn: warm forkserver (pid "));
  CHECK(has(second.err, ", run 2) of the daemon"));
  CHECK(count(second.out, "argv=['two'] path0=True env_rank=") == 2);
  // Another script, other arguments: the same server (the key is the interpreter, modules, environment).
  const Run third = run(warm, {fixture("exit3.py")});
  INFO(third.out << third.err);
  CHECK(third.code == 3);
  CHECK(has(third.err, ", run 3) of the daemon"));
  CHECK(count(third.out, "about to sys.exit(3)") >= 1);
  const std::string pid_of_first = first.err.substr(first.err.find("new forkserver (pid ") + 20, 8);
  CHECK(has(third.err, "warm forkserver (pid " + pid_of_first.substr(0, pid_of_first.find(','))));
}

TEST_CASE("python preload: a Lightning DDP fit (2 ranks, CPU) runs unmodified", "[e2e][python][preload]") {
  if (!python_imports("lightning")) {
    WARN("no Lightning in " << kPython << ": this case runs on the 2.15 line (bash scripts/setup-torch2.sh)");
    return;
  }
  Run pre = run({"--quiet", "--nprocs", "2", "--preload", "torch,lightning"}, {fixture("lightning_fit.py")},
                {"PYTHONWARNINGS=ignore"});
  if (pre.code == 1 && has(pre.err, "refused: importing 'lightning' started ") && machine_has_nvidia_gpu()) {
    // On a machine with an NVIDIA GPU, importing Lightning starts a thread of the NVIDIA libraries
    // (seen on an H100: docs/gpu.md): refused, named; the escape hatch forks anyway.
    INFO(pre.err);
    CHECK(has(pre.err, "not Python threads: "));
    pre = run({"--quiet", "--nprocs", "2", "--preload", "torch,lightning"}, {fixture("lightning_fit.py")},
              {"PYTHONWARNINGS=ignore", "LSPAWN_PRELOAD_ALLOW_THREADS=1"});
    CHECK(has(pre.err, "forking workers anyway (LSPAWN_PRELOAD_ALLOW_THREADS=1)"));
  }
  INFO(pre.out << pre.err);
  CHECK(pre.code == 0);
  CHECK(has(pre.out, "lightning rank 0/2 steps 4 weights in sync True"));
  CHECK(has(pre.out, "lightning rank 1/2 steps 4 weights in sync True"));
}

TEST_CASE("python preload: torchrun's program conventions - a .py program and -m MODULE run under --preload too",
          "[e2e][python][preload]") {
  // `lspawn --preload torch train.py` as torchrun users write it: the .py program runs under the
  // Python of LSPAWN_PYTHON, from the preloaded interpreter, with the script's own argv.
  auto torchrun_style = [&](const std::vector<std::string>& args) {
    std::vector<std::string> all{"--nprocs", "2", "--preload", "torch"};
    all.insert(all.end(), args.begin(), args.end());
    return run_job(all, {"LSPAWN_PYTHON=" + kPython});
  };
  const Run script = torchrun_style({fixture("allreduce.py"), "--lr", "0.1"});
  INFO(script.out << script.err);
  CHECK(script.code == 0);
  CHECK(count(script.out, "sum 3.0 ok; __name__=__main__ file=allreduce.py argv=['--lr', '0.1']") == 2);
  CHECK(has(script.err, "running " + kPython + " " + fixture("allreduce.py") + " ... (a .py program"));
  CHECK(has(script.err, "preloaded: torch"));
  const Run module = torchrun_style({"-m", "preload_main_pkg", "a", "b c"});
  INFO(module.out << module.err);
  CHECK(module.code == 0);
  CHECK(count(module.out, "__name__=__main__ argv=['a', 'b c'] argv0=__main__.py torch=True") == 2);
  CHECK(has(module.err, "running " + kPython + " -m preload_main_pkg ... (-m"));
  // --no-python cannot be preloaded: a usage error before anything starts.
  const Run no_python = torchrun_style({"--no-python", fixture("allreduce.py")});
  CHECK(no_python.code == lspawn::exit_codes::kUsage);
  CHECK(has(no_python.err, "--preload: runs a Python program; it cannot be --no-python"));
}
