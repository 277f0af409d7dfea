// Hang diagnosis of Python workers end to end (docs/hang-diagnosis.md, "Python workers"): the built
// lspawn runs a torch.distributed job (tests/e2e/fixtures/py_hang_job.py) under the Python of the
// LibTorch line under test, through `python -m lspawn_hang` (python/lspawn_hang.py), where rank 1
// sleeps in sleep_outside_collectives() while the others wait in an all_reduce.
//
// The collectives are named from torch's Flight Recorder where the torch has one (2.x: the 2.15
// line), else from torch.distributed's wrapped functions (1.13): the same report either way.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.hpp"
#include "launcher/cli_options.hpp"
#include "support/text.hpp"
#include "support/wait.hpp"

using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {

const std::string kPython = test_python();
const std::string kJob = LSPAWN_PY_HANG_JOB;
const std::string kPythonPath = std::string("PYTHONPATH=") + LSPAWN_PYTHON_DIR;
const std::string kLightningJob = LSPAWN_PY_HANG_LIGHTNING;

// Whether the report names rank 1 as the one behind. It does either way; how depends on torch's
// Flight Recorder: whether it has marked rank 1's last gloo collective (a broadcast) completed
// yet. Seen under load in a clean-clone CI run: "behind: rank 1 still in broadcast #23 ... (the
// others wait in all_reduce #24 ...)".
bool names_rank1_behind(const std::string& e) {
  return has(e, "behind: rank 1 has not entered a collective for ") || has(e, "behind: rank 1 still in broadcast #");
}

}  // namespace

TEST_CASE("python hang: --hang-timeout names the waiting ranks, the collective and the late rank's Python stack",
          "[e2e][hang][python]") {
  // As the torch has it (2.x: its Flight Recorder), and with the recorder turned off (the wrapped
  // torch.distributed functions record, as on 1.13).
  const std::string fr = GENERATE(as<std::string>{}, "", "TORCH_FR_BUFFER_SIZE=0");
  INFO("extra environment: " << fr);
  std::vector<std::string> env{kPythonPath};
  if (!fr.empty()) env.push_back(fr);
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "3", "--hang-timeout", "2", "--grace-period", "2", kPython, "-m", "lspawn_hang",
           kJob, "1", "3"},
          env);
  const int st = c.wait(90s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  const std::string& e = c.err();
  CHECK(count(e, "lspawn: hang: no rank made progress in its collectives for ") == 1);
  CHECK(has(e, "waiting: ranks 0, 2 in all_reduce #4 on group world, 16 B, for "));
  CHECK(has(e, "(2 of 3 members)"));
  CHECK(names_rank1_behind(e));
  CHECK(has(e, "the others wait in all_reduce #4 on group world (last completed: all_reduce #3 on group world"));
  CHECK(has(e, "main thread of rank 1 (pid "));
  CHECK(has(e, "), Python, most recent call last:"));
  CHECK(has(e, "py_hang_job.py\", line "));
  CHECK(has(e, ", in sleep_outside_collectives\nlspawn:       time.sleep(600)"));
  CHECK(!has(e, "<frozen runpy>"));  // the runner's frames are left out
  CHECK(has(e, "stopped by the hang watchdog"));
  const auto pids = worker_pids(c.out());
  CHECK(pids.size() == 3);
  CHECK(alive_after(pids, 2s).empty());
}

TEST_CASE("python hang: lspawn status PID shows the Python ranks while the job goes on", "[e2e][hang][python]") {
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--grace-period", "2", kPython, "-m", "lspawn_hang", kJob, "1", "2"},
          {kPythonPath});
  REQUIRE(c.wait_stdout_count("ready pid", 2, 60s));
  // The records follow torch's Flight Recorder within ~0.4 s (the op's name once its state held for a
  // poll: "collective #3" before): ask until the report names it.
  RunResult r;
  for (int i = 0; i < 50; ++i) {
    r = run_lspawn({"status", std::to_string(c.pid())});
    if (has(r.out, "in all_reduce #3") && has(r.out, "in sleep_outside_collectives")) break;
    std::this_thread::sleep_for(200ms);
  }
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.out, "lspawn: status of 2 ranks (on request)"));
  CHECK(has(r.out, "waiting: rank 0 in all_reduce #3 on group world, 16 B"));
  CHECK(has(r.out, "behind: rank 1 has not entered a collective for "));
  CHECK(has(r.out, "main thread of rank 1 (pid "));
  CHECK(has(r.out, ", in sleep_outside_collectives"));
  CHECK(alive(c.pid()));
  c.signal(SIGTERM);
  const int st = c.wait(30s);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 143);
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

TEST_CASE("python hang: a plain `python3 script.py` worker gets the report with no change to its command line",
          "[e2e][hang][python]") {
  // #34: lspawn's sitecustomize (python/lspawn_site/, launcher/python_site.hpp) installs lspawn_hang in
  // each Python worker it executes, then takes itself off PYTHONPATH and imports the user's own.
  TempDir user;
  write_file(user.path + "/sitecustomize.py", "MARK = 'user'\n");
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "3", "--hang-timeout", "2", "--grace-period", "2", kPython, kJob, "1", "3"},
          {"PYTHONPATH=" + user.path});
  const int st = c.wait(90s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  const std::string& e = c.err();
  CHECK(count(e, "lspawn: hang: no rank made progress in its collectives for ") == 1);
  CHECK(has(e, "waiting: ranks 0, 2 in all_reduce #4 on group world, 16 B, for "));
  CHECK(names_rank1_behind(e));
  CHECK(has(e, "main thread of rank 1 (pid "));
  CHECK(has(e, ", in sleep_outside_collectives\nlspawn:       time.sleep(600)"));
  CHECK(!has(e, "cannot see"));
  CHECK(count(c.out(), "env PYTHONPATH=" + user.path + " LSPAWN_PYTHON_SITE=None sitecustomize=user") == 3);
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

TEST_CASE(
    "python hang: with the sitecustomize off (LSPAWN_PYTHON_SITE=0, python -E) lspawn says at start that "
    "--hang-timeout cannot see the workers",
    "[e2e][hang][python]") {
  const auto [extra_env, arg, why] =
      GENERATE(std::make_tuple(std::string("LSPAWN_PYTHON_SITE=0"), std::string("-u"),
                               std::string("LSPAWN_PYTHON_SITE=0 is set")),
               std::make_tuple(std::string("LSPAWN_UNUSED=1"), std::string("-E"),
                               std::string("the interpreter runs with -E (PYTHONPATH ignored)")));
  INFO(extra_env << " " << arg);
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--hang-timeout", "30", "--grace-period", "2", kPython, arg, kJob, "1", "2"},
          {extra_env});
  REQUIRE(c.wait_stdout_count("ready pid", 2, 60s));
  CHECK(count(c.err(), "lspawn: --hang-timeout cannot see these Python workers: " + why +
                           ", so they write no status record") == 1);
  c.signal(SIGURG);  // lspawn's own report: it knows its workers, recorded or not
  REQUIRE(c.wait_output(
      [](const std::string&, const std::string& e) {
        return e.find("status of 2 ranks (on request)") != std::string::npos &&
               e.find("rank 1 has no status record") != std::string::npos;
      },
      10s));
  CHECK(has(c.err(), "rank 0 has no status record"));
  c.signal(SIGTERM);
  const int st = c.wait(30s);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 143);
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

TEST_CASE(
    "python hang: install() outside lspawn, with a bad RANK, an unusable directory, beside a program's SIGURG "
    "handler, its record header, and the python -m lspawn_hang runner",
    "[e2e][hang][python]") {
  Child c({kPython, LSPAWN_PY_HANG_CHECKS}, {kPythonPath});
  const int st = c.wait(120s);
  INFO(c.out() << c.err());
  CHECK(code_of(st) == 0);
  CHECK(has(c.out(), "all checks passed"));
}

TEST_CASE("python hang: Lightning DDP, a rank late in training_step: the others wait in the C++ reducer's all_reduce",
          "[e2e][hang][python]") {
  if (!python_imports("lightning")) {
    WARN("no Lightning in " << kPython << ": this case runs on the 2.15 line (bash scripts/setup-torch2.sh)");
    return;
  }
  // The reducer's all_reduce is seen through gloo's Flight Recorder only (torch >= 2.8): before it the
  // wrapped Python functions record, and no Python function issues the bucket's all_reduce
  // (docs/hang-diagnosis.md, "Where the collective comes from").
  if (!python_runs("import torch._C._distributed_c10d as c; assert hasattr(c, '_dump_fr_trace_json')")) {
    WARN("no gloo Flight Recorder in " << kPython << "'s torch (2.8+ has one): DDP's C++ reducer is not seen there");
    return;
  }
  Subreaper reaper;
  Child c({lspawn_bin(), "--nprocs", "2", "--hang-timeout", "2", "--grace-period", "2", kPython, "-m", "lspawn_hang",
           kLightningJob, "1", "3"},
          {kPythonPath, "PYTHONWARNINGS=ignore"});
  const int st = c.wait(120s);
  INFO(c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == lspawn::exit_codes::kHang);
  const std::string& e = c.err();
  // DDP's gradient bucket (Linear(8, 1): 9 floats), all-reduced by the reducer in C++: no Python function
  // issues it, torch's Flight Recorder sees it (on 1.13 no Lightning, so no case).
  CHECK(has(e, "waiting: rank 0 in all_reduce #"));
  CHECK(has(e, "on group world, 36 B, for "));
  CHECK(names_rank1_behind(e));
  CHECK(has(e, "main thread of rank 1 (pid "));
  CHECK(has(e, ", in training_step\nlspawn:       sleep_in_training_step()"));
  CHECK(has(e, ", in sleep_in_training_step\nlspawn:       time.sleep(600)"));
  CHECK(has(e, "stopped by the hang watchdog"));
  CHECK(alive_after(worker_pids(c.out()), 2s).empty());
}

// A worker that lspawn stops, or that is killed, leaves no semaphore name of multiprocessing's in /dev/shm and no
// pymp-* folder (docs/python.md, "A killed worker leaves nothing"). The folder is made in the run's directory,
// which lspawn removes. lspawn kills a failed or stopped worker's process group at once, so the resource
// tracker, multiprocessing's helper that unlinks what a dead process registered, must not be in it
// (lspawn_hang.no_multiprocessing_leftovers, from lspawn's sitecustomize and the preload bootstrap).
TEST_CASE(
    "python workers: a worker stopped by lspawn or killed leaves no multiprocessing semaphore in /dev/shm and no "
    "pymp folder",
    "[e2e][python]") {
  const auto [mode, how, code] = GENERATE(std::make_tuple(std::string("exec"), std::string("fail"), 3),
                                          std::make_tuple(std::string("exec"), std::string("kill"), 128 + SIGKILL),
                                          std::make_tuple(std::string("preload"), std::string("kill"), 128 + SIGKILL));
  INFO(mode << " " << how);
  Subreaper reaper;
  std::vector<std::string> argv{lspawn_bin(), "--nprocs", "2", "--grace-period", "2"};
  if (mode == "preload") argv.insert(argv.end(), {"--preload", "multiprocessing"});
  argv.insert(argv.end(), {kPython, LSPAWN_PY_MP_NAMES, how});
  Child c(argv);
  const int st = c.wait(60s);
  INFO(c.out() << c.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == code);
  std::vector<std::string> paths;
  int folders = 0;
  for (const auto& l : lines(c.out())) {
    if (const auto at = l.find("names "); at != std::string::npos) {
      std::istringstream in(l.substr(at + 6));
      for (std::string name; in >> name;) paths.push_back("/dev/shm/sem." + name.substr(name[0] == '/' ? 1 : 0));
    } else if (const auto at = l.find("tempdir "); at != std::string::npos) {
      paths.push_back(l.substr(at + 8));  // in lspawn's run directory (LSPAWN_RUN_DIR), removed with it
      ++folders;
    }
  }
  REQUIRE(paths.size() == 8);  // 3 names and a folder per rank
  CHECK(folders == 2);
  auto left = [&] {
    std::vector<std::string> there;
    for (const auto& p : paths) {
      if (::access(p.c_str(), F_OK) == 0) there.push_back(p);
    }
    return there;
  };
  // The tracker unlinks them once the last process holding its pipe is gone: it runs on after lspawn has exited.
  const bool gone = eventually([&] { return left().empty(); }, 10000ms);
  for (const auto& p : left()) {
    UNSCOPED_INFO("left: " << p);
    std::error_code ec;
    std::filesystem::remove_all(p, ec);  // nothing left for the next test either way
  }
  CHECK(gone);
}

// #33: the restart policy with Python workers. lspawn's sitecustomize (lspawn_hang) writes the
// "started" marker and wraps torch.distributed.init_process_group to write "rendezvous"
// (status/phase.hpp): an ImportError before it is not restarted, an exit after it is.
TEST_CASE("python restarts: a rank failing before init_process_group is not restarted, one failing after it is",
          "[e2e][python][restart]") {
  Child before({lspawn_bin(), "--nprocs", "2", "--max-restarts", "2", "--grace-period", "2", kPython, LSPAWN_PY_RESTART,
                "before"});
  int st = before.wait(120s);
  INFO(before.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 1);
  CHECK(has(before.err(), "ModuleNotFoundError: No module named 'lspawn_module_missing_on_purpose'"));
  CHECK(has(before.err(),
            "lspawn:   not restarted (2 restarts left): rank 1 failed before it reached its rendezvous "
            "(init_process_group): the next attempt would fail the same way"));
  CHECK(!has(before.err(), "restart 1 of 2"));
  Child after({lspawn_bin(), "--nprocs", "2", "--max-restarts", "2", "--grace-period", "2", kPython, LSPAWN_PY_RESTART,
               "after"});
  st = after.wait(120s);
  INFO(after.err());
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(has(after.err(), "restart 1 of 2"));
  CHECK(has(after.out(), "rank 1: attempt 1 ok"));
}
