// The guardian kills registered process groups when its owner dies, even by SIGKILL.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher/guardian.hpp"

using namespace std::chrono_literals;

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
