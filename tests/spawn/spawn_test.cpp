// spawn() behaviour pinned by torch.multiprocessing.spawn's own tests, for every start method.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "spawn/spawn.hpp"
#include "support/env.hpp"
#include "support/files.hpp"
#include "support/pids.hpp"
#include "support/temp_dir.hpp"
#include "support/wait.hpp"

using lspawn::ProcessContext;
using lspawn::SpawnOptions;
using lspawn::StartMethod;
using namespace lspawn::test;
using namespace std::chrono_literals;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

using lspawn::test::env_int;  // -1 when unset

// Returns what it learnt about its place, so the parent can check index and env agree.
std::vector<int> t_ok(int index, int mul, std::string tag) {
  std::printf("%s %d\n", tag.c_str(), index);
  return {index,
          index * mul,
          env_int("RANK"),
          env_int("LOCAL_RANK"),
          env_int("WORLD_SIZE"),
          env_int("MASTER_PORT"),
          std::getenv("TORCHELASTIC_ERROR_FILE") ? 1 : 0,
          std::getenv("LSPAWN_RUN_DIR") ? 1 : 0};
}
LSPAWN_REGISTER(t_ok);

void t_sleep(int, int ms) { sleep_ms(ms); }
LSPAWN_REGISTER(t_sleep);

void t_raise(int index, int bad, int delay_ms) {
  if (index == bad || bad < 0) {
    sleep_ms(delay_ms);
    throw std::runtime_error("boom from " + std::to_string(index));
  }
  sleep_ms(60000);
}
LSPAWN_REGISTER(t_raise);

void t_abort(int index, int bad) {
  if (index == bad) std::abort();
  sleep_ms(60000);
}
LSPAWN_REGISTER(t_abort);

void t_exit(int index, int bad, int code, std::string pid_dir, int nprocs) {
  write_file(pid_dir + "/" + std::to_string(index), std::to_string(::getpid()));
  if (index == bad) {
    // Once every sibling has written its pid (an event, not a delay: a loaded machine may take
    // long to start them).
    wait_files(pid_dir + "/", nprocs, 20s);
    std::fflush(nullptr);
    std::_Exit(code);
  }
  sleep_ms(60000);
}
LSPAWN_REGISTER(t_exit);

void t_ok_then_raise(int index) {
  if (index == 1) {
    sleep_ms(300);
    throw std::logic_error("late failure");
  }
}
LSPAWN_REGISTER(t_ok_then_raise);

// Rank 0 handles SIGTERM by finishing cleanly (within the grace period); rank 1 fails once
// rank 0 is ready.
std::atomic<bool> g_term{false};
void t_graceful(int index, std::string dir) {
  if (index == 0) {
    ::signal(SIGTERM, [](int) { g_term = true; });
    write_file(dir + "/ready", "1");
    while (!g_term) sleep_ms(5);
    sleep_ms(200);
    write_file(dir + "/clean", "1");
    return;
  }
  wait_file(dir + "/ready", 10s);
  throw std::runtime_error("rank 1 fails");
}
LSPAWN_REGISTER(t_graceful);

// Each worker forks a grandchild (which sleeps) and records both pids.
void t_family(int index, std::string dir) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    sleep_ms(60000);
    std::_Exit(0);
  }
  const char* run_dir = std::getenv("LSPAWN_RUN_DIR");
  write_file(dir + "/pids-" + std::to_string(index),
             std::to_string(::getpid()) + " " + std::to_string(child) + " " + (run_dir ? run_dir : "-"));
  sleep_ms(60000);
}
LSPAWN_REGISTER(t_family);

// Each worker says it started, then waits until all `nprocs` have: only workers started side by
// side all return; one started after another's return never comes (that one throws after 20 s).
void t_meet(int index, std::string dir, int nprocs) {
  write_file(dir + "/started-" + std::to_string(index), "1");
  const bool all = wait_files(dir + "/started-", nprocs, 20s);
  if (!all) throw std::runtime_error("worker " + std::to_string(index) + ": the others never started beside it");
}
LSPAWN_REGISTER(t_meet);

const StartMethod kMethods[] = {StartMethod::Fork, StartMethod::Spawn, StartMethod::Forkserver};

SpawnOptions quiet(StartMethod m, int nprocs) {
  SpawnOptions o;
  o.start_method = m;
  o.nprocs = nprocs;
  o.grace_period = 2000ms;
  o.on_info = [](const std::string&) {};
  return o;
}

}  // namespace

TEST_CASE("spawn success: each index once, first, with the env contract - results come back") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  lspawn::CaptureSink capture;
  SpawnOptions o = quiet(m, 3);
  o.sinks = {&capture};
  ProcessContext ctx = lspawn::spawn(t_ok, std::make_tuple(10, std::string("hello")), o);
  CHECK(ctx.finished());
  const auto results = ctx.results<std::vector<int>>();
  REQUIRE(results.size() == 3);
  std::set<int> ports;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(results[i]);
    const auto& r = *results[i];
    CHECK(r[0] == i);       // the index arrives first, once per process
    CHECK(r[1] == i * 10);  // then the arguments
    CHECK(r[2] == i);       // RANK
    CHECK(r[3] == i);       // LOCAL_RANK
    CHECK(r[4] == 3);       // WORLD_SIZE
    CHECK(r[5] > 0);        // MASTER_PORT, reserved for the run
    CHECK(r[6] == 1);       // TORCHELASTIC_ERROR_FILE
    CHECK(r[7] == 1);       // LSPAWN_RUN_DIR
    ports.insert(r[5]);
    CHECK(capture.text(i, lspawn::Stream::Stdout) == "hello " + std::to_string(i) + "\n");
  }
  CHECK(ports.size() == 1);
  for (const auto& w : ctx.workers()) {
    CHECK(w.exited);
    CHECK(w.exit_code == 0);
    CHECK_FALSE(alive(w.pid));
  }
}

TEST_CASE("spawn join=false, then join(timeout) repeatedly until true") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  SpawnOptions o = quiet(m, 2);
  o.join = false;
  ProcessContext ctx = lspawn::spawn(t_sleep, std::make_tuple(400), o);
  REQUIRE(ctx.pids().size() == 2);
  for (pid_t p : ctx.pids()) CHECK(p > 0);
  CHECK_FALSE(ctx.join(1ms));
  int rounds = 0;
  while (!ctx.join(50ms)) {
    ++rounds;
    REQUIRE(rounds < 200);  // 10 s
  }
  CHECK(rounds >= 1);
  CHECK(ctx.join(1ms));  // stays true
  CHECK(ctx.join());
  for (pid_t p : ctx.pids()) CHECK_FALSE(alive(p));
}

TEST_CASE("spawn: one rank throws -> the message names it and carries the exception text") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lspawn::spawn(t_raise, std::make_tuple(1, 0), quiet(m, 3));
    FAIL("spawn did not throw");
  } catch (const lspawn::ProcessRaisedException& e) {
    CHECK(e.index() == 1);
    CHECK(e.type() == "std::runtime_error");
    CHECK(e.what_text() == "boom from 1");
    CHECK_THAT(e.what(), Catch::StartsWith("process 1 terminated with the following error:") &&
                             Catch::Contains("std::runtime_error: boom from 1"));
  }
  // The siblings (sleeping 60 s) were terminated, not waited for.
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
}

TEST_CASE("spawn: all ranks throw -> one of them is reported") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  try {
    lspawn::spawn(t_raise, std::make_tuple(-1, 0), quiet(m, 3));
    FAIL("spawn did not throw");
  } catch (const lspawn::ProcessRaisedException& e) {
    CHECK(e.index() >= 0);
    CHECK(e.index() < 3);
    CHECK(e.what_text() == "boom from " + std::to_string(e.index()));
  }
}

TEST_CASE("spawn: a rank killed by SIGABRT -> 'terminated with signal SIGABRT'") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  try {
    lspawn::spawn(t_abort, std::make_tuple(1), quiet(m, 2));
    FAIL("spawn did not throw");
  } catch (const lspawn::ProcessExitedException& e) {
    CHECK(e.index() == 1);
    CHECK(e.signal() == SIGABRT);
    CHECK(e.exit_code() == 0);
    CHECK(std::string(e.what()) == "process 1 terminated with signal SIGABRT");
  }
}

TEST_CASE("spawn: a rank exits 123 -> 'exit code 123' and no process is left alive") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  TempDir dir;
  try {
    lspawn::spawn(t_exit, std::make_tuple(1, 123, dir.path, 3), quiet(m, 3));
    FAIL("spawn did not throw");
  } catch (const lspawn::ProcessExitedException& e) {
    CHECK(e.index() == 1);
    CHECK(e.exit_code() == 123);
    CHECK(e.signal() == 0);
    CHECK(std::string(e.what()) == "process 1 terminated with exit code 123");
  }
  for (int i = 0; i < 3; ++i) {
    const std::string pid_text = read_file(dir.path + "/" + std::to_string(i));
    REQUIRE_FALSE(pid_text.empty());
    CHECK_FALSE(alive(std::stoi(pid_text)));
  }
}

TEST_CASE("spawn: rank 0 succeeds and rank 1 throws later -> still reported") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  try {
    lspawn::spawn(t_ok_then_raise, quiet(m, 2));
    FAIL("spawn did not throw");
  } catch (const lspawn::ProcessRaisedException& e) {
    CHECK(e.index() == 1);
    CHECK(e.type() == "std::logic_error");
    CHECK(e.what_text() == "late failure");
  }
}

TEST_CASE("spawn: a sibling that exits on its own within the grace period is not killed") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  TempDir dir;
  SpawnOptions o = quiet(m, 2);
  o.grace_period = 10000ms;
  o.join = false;
  ProcessContext ctx = lspawn::spawn(t_graceful, std::make_tuple(dir.path), o);
  CHECK_THROWS_AS(ctx.join(), lspawn::ProcessRaisedException);
  const auto& w0 = ctx.workers().at(0);
  CHECK(w0.stop_signal_sent == SIGTERM);  // it was asked to stop ...
  CHECK(w0.term_signal == 0);             // ... and finished by itself, never SIGKILLed
  CHECK(w0.exit_code == 0);
  CHECK(path_exists(dir.path + "/clean"));
}

TEST_CASE(
    "spawn daemon: the parent is killed -> its guardian kills children and grandchildren, then removes the run "
    "directory",
    "[counts-threads]") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  TempDir dir;
  constexpr int kProcs = 2;
  std::fflush(nullptr);
  const pid_t parent = ::fork();
  if (parent == 0) {
    try {
      SpawnOptions o = quiet(m, kProcs);
      o.daemon = true;
      lspawn::spawn(t_family, std::make_tuple(dir.path), o);
    } catch (...) {}
    std::_Exit(1);
  }
  std::vector<pid_t> family;
  std::string run_dir;
  REQUIRE(wait_files(dir.file("pids-"), kProcs, 20s));
  for (int i = 0; i < kProcs; ++i) {
    std::istringstream in(read_file(dir.path + "/pids-" + std::to_string(i)));
    pid_t worker = 0, grandchild = 0;
    in >> worker >> grandchild >> run_dir;
    family.push_back(worker);
    family.push_back(grandchild);
  }
  for (pid_t p : family) REQUIRE(alive(p));
  INFO("run directory " << run_dir);
  REQUIRE(run_dir.rfind("/", 0) == 0);
  REQUIRE(path_exists(run_dir));
  lspawn::sys::kill(parent, SIGKILL, "test");
  int status;
  lspawn::sys::waitpid(parent, &status, 0, "test");
  // The parent's guardian SIGKILLs every worker's process group, then removes the spawn's private directory:
  // wait for that (an event; milliseconds on a quiet machine, docs/reliability.md measures it), then every
  // process of the family must be gone, or on its way out of SIGKILL.
  CHECK(eventually([&] { return !path_exists(run_dir); }, 30000ms));
  const bool all_gone = eventually([&] { return std::none_of(family.begin(), family.end(), alive); }, 2000ms);
  if (!all_gone) {
    for (pid_t p : family) {
      if (alive(p)) UNSCOPED_INFO("left alive: pid " << p << ": " << read_file("/proc/" + std::to_string(p) + "/stat"));
    }
  }
  CHECK(all_gone);
  if (!all_gone) {  // leave nothing behind for the next test
    for (pid_t p : family) ::kill(p, SIGKILL);
  }
}

TEST_CASE("spawn Forkserver: 8 workers start side by side, not one after another") {
  // Each waits for all 8 to have started: a forkserver that started them one at a time (or the
  // next only after the last returned) would fail, whatever the machine's speed.
  constexpr int kProcs = 8;
  TempDir dir;
  REQUIRE_NOTHROW(lspawn::spawn(t_meet, std::make_tuple(dir.path, kProcs), quiet(StartMethod::Forkserver, kProcs)));
  for (int i = 0; i < kProcs; ++i) CHECK(path_exists(dir.path + "/started-" + std::to_string(i)));
}

TEST_CASE("spawn terminate() stops running workers - a daemon context does it when destroyed") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  SpawnOptions o = quiet(m, 2);
  o.join = false;
  std::vector<pid_t> pids;
  {
    ProcessContext ctx = lspawn::spawn(t_sleep, std::make_tuple(60000), o);
    pids = ctx.pids();
    ctx.terminate();
    CHECK(ctx.finished());
    CHECK(ctx.join(1ms));
    for (pid_t p : pids) CHECK_FALSE(alive(p));
  }
  {
    ProcessContext ctx = lspawn::spawn(t_sleep, std::make_tuple(60000), o);
    pids = ctx.pids();
  }
  for (pid_t p : pids) CHECK_FALSE(alive(p));
}

TEST_CASE("spawn with results from rank 0 only") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  SpawnOptions o = quiet(m, 3);
  o.results = lspawn::ResultFrom::Rank0;
  const auto r = lspawn::spawn(t_ok, std::make_tuple(1, std::string("x")), o).results<std::vector<int>>();
  REQUIRE(r.size() == 3);
  CHECK(r[0]);
  CHECK_FALSE(r[1]);
  CHECK_FALSE(r[2]);
}

TEST_CASE("spawn nprocs: 1 runs in the calling process - invalid values fail before starting") {
  const pid_t self = ::getpid();
  SpawnOptions o = quiet(StartMethod::Spawn, 1);
  auto ctx = lspawn::spawn([self](int index) { return index == 0 && ::getpid() == self; }, o);
  CHECK(ctx.pids().empty());
  CHECK(ctx.results<bool>().at(0) == true);
  // Exceptions propagate unchanged.
  CHECK_THROWS_AS(lspawn::spawn([](int) { throw std::out_of_range("x"); }, o), std::out_of_range);
  for (int bad : {0, -2, 100000}) {
    o.nprocs = bad;
    CHECK_THROWS_WITH(lspawn::spawn(t_sleep, std::make_tuple(0), o),
                      Catch::Contains("nprocs=" + std::to_string(bad) + " is invalid"));
  }
}

TEST_CASE("spawn: start methods that exec or use the forkserver need a registered function") {
  for (StartMethod m : {StartMethod::Spawn, StartMethod::Forkserver}) {
    CHECK_THROWS_WITH(lspawn::spawn([](int) {}, quiet(m, 2)), Catch::Contains("LSPAWN_REGISTER"));
  }
  // Fork runs any callable, lambdas with captures included.
  const int base = 7;
  auto ctx = lspawn::spawn([base](int index) { return base + index; }, quiet(StartMethod::Fork, 2));
  CHECK(ctx.results<int>() == std::vector<std::optional<int>>{7, 8});
}

TEST_CASE("spawn Fork refuses a process that runs threads, naming the count", "[counts-threads]") {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread t([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stop; });
  });
  CHECK_THROWS_WITH(lspawn::spawn(t_sleep, std::make_tuple(0), quiet(StartMethod::Fork, 2)),
                    Catch::Contains("runs 2 threads") && Catch::Contains("Forkserver"));
  // The forkserver (forked before any thread) is the safe way from here.
  CHECK_NOTHROW(lspawn::spawn(t_sleep, std::make_tuple(0), quiet(StartMethod::Forkserver, 2)));
  SpawnOptions o = quiet(StartMethod::Fork, 2);
  o.allow_fork_with_threads = true;
  CHECK_NOTHROW(lspawn::spawn(t_sleep, std::make_tuple(0), o));
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_one();
  t.join();
}

TEST_CASE("spawn nprocs unset: one process per visible accelerator, else one in-process", "[counts-threads]") {
  const char* saved = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string keep = saved ? saved : "";
  SpawnOptions o = quiet(StartMethod::Fork, 1);
  o.nprocs.reset();
  ::setenv("CUDA_VISIBLE_DEVICES", "0,1", 1);
  CHECK(lspawn::local_accelerator_count() == 2);
  auto two = lspawn::spawn([](int index) { return index; }, o);
  CHECK(two.pids().size() == 2);
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  CHECK(lspawn::local_accelerator_count() == 0);
  auto one = lspawn::spawn([](int index) { return index; }, o);
  CHECK(one.pids().empty());  // ran in the calling process
  ::setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  CHECK(lspawn::local_accelerator_count() == 0);
  if (saved) {
    ::setenv("CUDA_VISIBLE_DEVICES", keep.c_str(), 1);
  } else {
    ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
}
