#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "supervisor/error_file.hpp"
#include "spawn/errors.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/registry.hpp"
#include "spawn/worker.hpp"
#include "sys/sys.hpp"
#include "proto/wire.hpp"
#include "support/pids.hpp"
#include "support/temp_dir.hpp"

namespace {
int fs_echo(int index, std::string text) {
  std::printf("%s from %d\n", text.c_str(), index);
  return index * 10;
}
void fs_exit(int, int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}
void fs_abort(int) { std::abort(); }
void fs_sleep(int, int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
void fs_throw(int, std::string what) { throw std::invalid_argument(what); }
}  // namespace
LSPAWN_REGISTER(fs_echo);
LSPAWN_REGISTER(fs_exit);
LSPAWN_REGISTER(fs_abort);
LSPAWN_REGISTER(fs_sleep);
LSPAWN_REGISTER(fs_throw);

using lspawn::test::alive;
using lspawn::test::TempDir;

namespace {
template <class... A>
lspawn::proto::SpawnCall make_call(const char* fn, int index, const std::tuple<A...>& args) {
  lspawn::proto::SpawnCall c;
  c.version = 1;
  c.function = fn;
  c.index = index;
  c.nprocs = 1;
  c.args = lspawn::encode_args(args);
  return c;
}

// Collects ChildExit frames until `n` arrived; fails after 5 s.
std::vector<lspawn::proto::ChildExit> wait_exits(lspawn::Forkserver& fs, size_t n) {
  std::vector<lspawn::proto::ChildExit> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (out.size() < n) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    pollfd p{fs.exit_fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    for (auto& e : fs.read_exits()) out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_CASE("forkserver runs a registered function with the given stdio and reports its exit") {
  TempDir dir;
  auto fs = lspawn::Forkserver::start();
  auto out = lspawn::sys::make_pipe("test stdout");
  auto call = make_call("fs_echo", 3, std::make_tuple(std::string("hello")));
  call.want_result = true;
  call.result_path = dir.path + "/result";
  const pid_t pid = fs->fork_worker(call, {}, out.write.get(), 2);
  CHECK(pid > 0);
  out.write.reset();
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = lspawn::sys::read_some(out.read.get(), buf, sizeof buf, "test")) > 0) {
    text.append(buf, static_cast<size_t>(n));
  }
  CHECK(text == "hello from 3\n");
  const auto exits = wait_exits(*fs, 1);
  CHECK(exits[0].pid == pid);
  CHECK(exits[0].index == 3);
  CHECK(exits[0].exit_code == 0);
  CHECK(exits[0].signal == 0);
  lspawn::proto::SpawnResult result;
  lspawn::read_frame_file(dir.path + "/result", result, 1 << 20);
  CHECK(result.index == 3);
  CHECK(result.returned);
  CHECK(lspawn::Codec<int>::decode(result.value) == 30);
}

TEST_CASE("forkserver reports exit codes and signals of its workers") {
  auto fs = lspawn::Forkserver::start();
  const pid_t a = fs->fork_worker(make_call("fs_exit", 0, std::make_tuple(123)), {});
  const pid_t b = fs->fork_worker(make_call("fs_abort", 1, std::tuple<>()), {});
  auto exits = wait_exits(*fs, 2);
  for (const auto& e : exits) {
    if (e.pid == a) {
      CHECK(e.exit_code == 123);
      CHECK(e.signal == 0);
    } else {
      CHECK(e.pid == b);
      CHECK(e.signal == SIGABRT);
    }
  }
}

TEST_CASE("forkserver worker that throws writes an error report and exits 1") {
  TempDir dir;
  auto fs = lspawn::Forkserver::start();
  const std::string ef = dir.path + "/error.json";
  fs->fork_worker(make_call("fs_throw", 2, std::make_tuple(std::string("bad input"))),
                  {"TORCHELASTIC_ERROR_FILE=" + ef, "PATH=/usr/bin:/bin"});
  const auto exits = wait_exits(*fs, 1);
  CHECK(exits[0].exit_code == 1);
  const auto r = lspawn::read_error_file(ef);
  REQUIRE(r.report);
  CHECK(r.report->rank == 2);
  CHECK(r.report->exception_type == "std::invalid_argument");
  CHECK(r.report->message == "bad input");
}

TEST_CASE("forkserver refuses a function that is not registered") {
  auto fs = lspawn::Forkserver::start();
  CHECK_THROWS_WITH(fs->fork_worker(make_call("no_such_fn", 0, std::tuple<>()), {}),
                    Catch::Contains("'no_such_fn' is not registered") && Catch::Contains("fs_echo"));
  // The server is still usable afterwards.
  fs->fork_worker(make_call("fs_exit", 0, std::make_tuple(0)), {});
  CHECK(wait_exits(*fs, 1)[0].exit_code == 0);
}

TEST_CASE("workers run in their own process group") {
  auto fs = lspawn::Forkserver::start();
  const pid_t pid = fs->fork_worker(make_call("fs_sleep", 0, std::make_tuple(5000)), {});
  CHECK(::getpgid(pid) == pid);
  CHECK(lspawn::sys::kill(-pid, SIGKILL, "test"));
  CHECK(wait_exits(*fs, 1)[0].signal == SIGKILL);
}

TEST_CASE("destroying the forkserver kills the workers still running") {
  auto fs = lspawn::Forkserver::start();
  const pid_t server = fs->pid();
  const pid_t pid = fs->fork_worker(make_call("fs_sleep", 0, std::make_tuple(60000)), {});
  REQUIRE(alive(pid));
  const auto t0 = std::chrono::steady_clock::now();
  fs.reset();
  CHECK_FALSE(alive(server));  // reaped by the destructor
  while (alive(pid) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK_FALSE(alive(pid));
}

TEST_CASE("the forkserver and its workers die when the owner is SIGKILLed") {
  auto ready = lspawn::sys::make_pipe("test ready");
  std::fflush(nullptr);
  const pid_t owner = ::fork();
  if (owner == 0) {
    try {
      auto fs = lspawn::Forkserver::start();
      const pid_t w = fs->fork_worker(make_call("fs_sleep", 0, std::make_tuple(60000)), {});
      const int32_t pids[2] = {fs->pid(), w};
      lspawn::sys::write_all(ready.write.get(), std::string_view(reinterpret_cast<const char*>(pids), sizeof pids),
                             "ready");
      ::pause();
    } catch (...) {}
    ::_exit(1);
  }
  ready.write.reset();
  int32_t pids[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof pids) {
    const ssize_t n =
        lspawn::sys::read_some(ready.read.get(), reinterpret_cast<char*>(pids) + got, sizeof pids - got, "ready");
    REQUIRE(n > 0);
    got += static_cast<size_t>(n);
  }
  lspawn::sys::kill(owner, SIGKILL, "test");
  int status;
  lspawn::sys::waitpid(owner, &status, 0, "test");
  const auto t0 = std::chrono::steady_clock::now();
  while ((alive(pids[0]) || alive(pids[1])) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK_FALSE(alive(pids[0]));
  CHECK_FALSE(alive(pids[1]));
}

TEST_CASE("result files: garbage, truncation and oversize frames are rejected with the path") {
  TempDir dir;
  const std::string path = dir.path + "/result";
  lspawn::proto::SpawnResult r;
  {
    std::FILE* f = std::fopen(path.c_str(), "we");
    std::fputs("\xff\xff\xff\x7fgarbage", f);  // a length of 2 GiB
    std::fclose(f);
  }
  CHECK_THROWS_WITH(lspawn::read_frame_file(path, r, 1 << 20),
                    Catch::Contains(path) && Catch::Contains("exceeds the bound"));
  {
    std::FILE* f = std::fopen(path.c_str(), "we");
    std::fputs("\x10\x00", f);  // a truncated header
    std::fclose(f);
  }
  CHECK_THROWS_AS(lspawn::read_frame_file(path, r, 1 << 20), lspawn::wire::WireError);
  {
    std::FILE* f = std::fopen(path.c_str(), "we");
    const char frame[] = {3, 0, 0, 0, '\x0a', '\x0b', '\x0c'};  // 3 bytes that do not parse
    std::fwrite(frame, 1, sizeof frame, f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH(lspawn::read_frame_file(path, r, 1 << 20), Catch::Contains("malformed"));
  CHECK_THROWS_WITH(lspawn::read_frame_file(dir.path + "/missing", r, 1 << 20), Catch::Contains("missing"));
}

TEST_CASE("run_worker writes the result, or the error report and returns 1") {
  TempDir dir;
  lspawn::WorkerBody ok;
  ok.index = 2;
  ok.result_path = dir.path + "/r";
  ok.call = [] { return std::optional<lspawn::proto::Value>(lspawn::Codec<int>::encode(5)); };
  CHECK(lspawn::run_worker(ok) == 0);
  lspawn::proto::SpawnResult r;
  lspawn::read_frame_file(ok.result_path, r, 1 << 20);
  CHECK(r.index == 2);
  CHECK(lspawn::Codec<int>::decode(r.value) == 5);

  lspawn::WorkerBody bad;
  bad.index = 1;
  bad.error_file = dir.path + "/err.json";
  bad.call = []() -> std::optional<lspawn::proto::Value> { throw 42; };  // not a std::exception
  CHECK(lspawn::run_worker(bad) == 1);
  const auto report = lspawn::read_error_file(bad.error_file);
  REQUIRE(report.report);
  CHECK(report.report->exception_type == "int");
  CHECK(report.report->rank == 1);
}
