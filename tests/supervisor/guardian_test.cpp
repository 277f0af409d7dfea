// The guardian kills registered process groups when its owner dies, even by SIGKILL.
#include <catch2/catch.hpp>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/guardian.hpp"
#include "sys/sys.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"
#include "support/wait.hpp"

using namespace std::chrono_literals;
using lspawn::test::eventually;
using lspawn::test::path_exists;
using lspawn::test::write_file;

namespace {
// A process in a new process group that sleeps; returns its pid (= pgid).
pid_t start_sleeper() {
  pid_t p = fork();
  if (p == 0) {
    setpgid(0, 0);
    for (;;) pause();
  }
  setpgid(p, p);
  return p;
}

bool exited_within(pid_t p, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    int st;
    if (waitpid(p, &st, WNOHANG) == p) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

// Runs `body(guardian)` in a forked owner process, which then dies by SIGKILL.
void owner_dies(pid_t sleeper, bool register_it, bool unregister_it, bool clean) {
  pid_t owner = fork();
  if (owner == 0) {
    {
      lspawn::Guardian g;
      if (register_it) g.register_group(sleeper);
      if (unregister_it) g.unregister_group(sleeper);
      if (clean) g.shutdown();
      raise(SIGKILL);  // dies holding the guardian (no destructor runs)
    }
  }
  int st;
  waitpid(owner, &st, 0);
  REQUIRE(WIFSIGNALED(st));
}
}  // namespace

TEST_CASE("guardian: owner killed -> registered groups SIGKILLed", "[guardian]") {
  const pid_t s = start_sleeper();
  owner_dies(s, true, false, false);
  CHECK(exited_within(s, 2s));
}

TEST_CASE("guardian: clean shutdown or unregistered group -> nothing killed", "[guardian]") {
  const pid_t s1 = start_sleeper();
  owner_dies(s1, true, false, true);
  const pid_t s2 = start_sleeper();
  owner_dies(s2, true, true, false);
  CHECK_FALSE(exited_within(s1, 200ms));
  CHECK_FALSE(exited_within(s2, 10ms));
  kill(s1, SIGKILL);
  kill(s2, SIGKILL);
  CHECK(exited_within(s1, 2s));
  CHECK(exited_within(s2, 2s));
}

TEST_CASE("guardian: lives in its own process group", "[guardian]") {
  lspawn::Guardian g;
  CHECK(g.pid() > 0);
  CHECK(getpgid(g.pid()) == g.pid());
  CHECK(g.write_fd() >= 0);
  g.shutdown();
  CHECK(g.write_fd() < 0);
  g.shutdown();  // idempotent
}

namespace {
std::string exe_of(pid_t pid) {
  char buf[PATH_MAX] = {};
  const ssize_t n = readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Sets LSPAWN_GUARDIAN for the scope (nullptr: unset), restoring what was there.
struct GuardianEnv {
  std::string saved;
  bool had = false;
  explicit GuardianEnv(const char* value) {
    if (const char* v = std::getenv("LSPAWN_GUARDIAN")) {
      saved = v;
      had = true;
    }
    if (value) {
      setenv("LSPAWN_GUARDIAN", value, 1);
    } else {
      unsetenv("LSPAWN_GUARDIAN");
    }
  }
  ~GuardianEnv() {
    if (had) {
      setenv("LSPAWN_GUARDIAN", saved.c_str(), 1);
    } else {
      unsetenv("LSPAWN_GUARDIAN");
    }
  }
};
}  // namespace

TEST_CASE("guardian: runs the small lspawn-guardian program, not a fork of its owner", "[guardian]") {
  GuardianEnv env(nullptr);
  const std::string program = lspawn::Guardian::find_program();
  REQUIRE(ends_with(program, "/lspawn-guardian"));  // the build tree's
  lspawn::Guardian g;
  CHECK(g.program() == program);
  // posix_spawn returns once the exec happened.
  CHECK(ends_with(exe_of(g.pid()), "/lspawn-guardian"));
  CHECK(exe_of(g.pid()) != exe_of(getpid()));
  CHECK(getpgid(g.pid()) == g.pid());
  g.shutdown();
}

TEST_CASE("guardian: the lspawn-guardian program kills registered groups when its owner is SIGKILLed", "[guardian]") {
  GuardianEnv env(nullptr);
  REQUIRE_FALSE(lspawn::Guardian::find_program().empty());
  const pid_t s = start_sleeper();
  owner_dies(s, true, false, false);
  CHECK(exited_within(s, 2s));
}

TEST_CASE("guardian: without the program (LSPAWN_GUARDIAN empty or not executable) it forks, same contract",
          "[guardian]") {
  for (const char* value : {"", "/nonexistent/lspawn-guardian"}) {
    GuardianEnv env(value);
    INFO("LSPAWN_GUARDIAN='" << value << "'");
    CHECK(lspawn::Guardian::find_program().empty());
    {
      lspawn::Guardian g;
      CHECK(g.program().empty());
      CHECK(exe_of(g.pid()) == exe_of(getpid()));  // a fork of this test
      CHECK(getpgid(g.pid()) == g.pid());
      g.shutdown();
    }
    const pid_t killed = start_sleeper();
    owner_dies(killed, true, false, false);
    CHECK(exited_within(killed, 2s));
    const pid_t kept = start_sleeper();
    owner_dies(kept, true, false, true);
    CHECK_FALSE(exited_within(kept, 200ms));
    kill(kept, SIGKILL);
    CHECK(exited_within(kept, 2s));
  }
}

namespace {
// Whether `p` is removed within `limit`.
bool gone_within(const std::string& p, std::chrono::milliseconds limit) {
  return eventually([&] { return !path_exists(p); }, limit);
}

// A run directory as lspawn leaves it (files two levels deep), plus links out of it: to a file
// and to a directory that are not the run's and must survive its removal.
struct RunTree {
  lspawn::test::TempDir dir;
  std::string root = dir.path, run = root + "/run", outside_file = root + "/keep.txt", outside_dir = root + "/keep";
  RunTree() {
    REQUIRE(mkdir(run.c_str(), 0700) == 0);
    REQUIRE(mkdir((run + "/lspawn-status").c_str(), 0700) == 0);
    REQUIRE(mkdir((run + "/a").c_str(), 0700) == 0);
    REQUIRE(mkdir((run + "/a/b").c_str(), 0700) == 0);
    REQUIRE(mkdir(outside_dir.c_str(), 0700) == 0);
    write_file(outside_file, "not the run's");
    write_file(outside_dir + "/inner.txt", "not the run's");
    write_file(run + "/error-0.json", "{}");
    write_file(run + "/lspawn-status/rank-0.status", "x");
    write_file(run + "/a/b/deep", "x");
    for (int i = 0; i < 300; ++i) write_file(run + "/a/many-" + std::to_string(i), "x");  // > one getdents64 buffer
    REQUIRE(symlink(outside_file.c_str(), (run + "/link-to-file").c_str()) == 0);
    REQUIRE(symlink(outside_dir.c_str(), (run + "/link-to-dir").c_str()) == 0);
  }
};

// The owner names `dir`, then shuts the guardian down cleanly or not, then dies by SIGKILL.
void owner_with_dir_dies(const std::string& dir, bool clean) {
  std::fflush(nullptr);
  pid_t owner = fork();
  if (owner == 0) {
    lspawn::Guardian g;
    g.remove_on_owner_death("/tmp/replaced-by-the-next-call");
    g.remove_on_owner_death(dir);
    if (clean) g.shutdown();
    raise(SIGKILL);
  }
  int st;
  waitpid(owner, &st, 0);
  REQUIRE(WIFSIGNALED(st));
}
}  // namespace

TEST_CASE("guardian: owner killed -> the directory it named is removed, what its links point to is kept",
          "[guardian]") {
  for (const char* program : {static_cast<const char*>(nullptr), ""}) {  // lspawn-guardian, then the fork fallback
    GuardianEnv env(program);
    INFO("LSPAWN_GUARDIAN " << (program ? "''" : "unset"));
    RunTree t;
    owner_with_dir_dies(t.run, false);
    CHECK(gone_within(t.run, 2s));
    CHECK(path_exists(t.outside_file));
    CHECK(path_exists(t.outside_dir + "/inner.txt"));
    CHECK(path_exists(t.root));
  }
}

TEST_CASE("guardian: clean shutdown -> the directory stays (its owner removes it)", "[guardian]") {
  RunTree t;
  owner_with_dir_dies(t.run, true);
  CHECK_FALSE(gone_within(t.run, 200ms));
  CHECK(path_exists(t.run + "/a/b/deep"));
}

TEST_CASE("guardian: remove_on_owner_death refuses a path that is not absolute, naming it", "[guardian]") {
  lspawn::Guardian g;
  CHECK_THROWS_WITH(g.remove_on_owner_death("tmp/run"), Catch::Contains("'tmp/run'") && Catch::Contains("absolute"));
  CHECK_THROWS_WITH(g.remove_on_owner_death(""), Catch::Contains("absolute"));
  CHECK_THROWS_WITH(g.remove_on_owner_death("/" + std::string(PATH_MAX, 'x')), Catch::Contains("PATH_MAX"));
  g.shutdown();
}
