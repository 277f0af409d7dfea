// sys::child_setup: the first steps of every child lspawn forks (sys/child_setup.hpp), in real
// forked processes.
#include <catch2/catch.hpp>

#include <csignal>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sys/child_setup.hpp"

namespace sys = lspawn::sys;

namespace {

// Runs `child` in a forked process; returns its wait status.
template <class F>
int in_child(F child) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(child());
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("sys: child_setup with a live parent - own group, death signal, returns", "[sys]") {
  const pid_t parent = ::getpid();
  const int st = in_child([parent] {
    sys::child_setup(parent, SIGHUP);
    int sig = 0;
    ::prctl(PR_GET_PDEATHSIG, &sig);
    if (sig != SIGHUP) return 10;
    if (::getpgid(0) != ::getpid()) return 11;  // a group of its own
    return 0;
  });
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("sys: child_setup ChildGroup::kInherit keeps the parent's group", "[sys]") {
  const pid_t parent = ::getpid();
  const pid_t group = ::getpgid(0);
  const int st = in_child([parent, group] {
    sys::child_setup(parent, SIGKILL, sys::ChildGroup::kInherit);
    int sig = 0;
    ::prctl(PR_GET_PDEATHSIG, &sig);
    if (sig != SIGKILL) return 10;
    return ::getpgid(0) == group ? 0 : 11;
  });
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}

TEST_CASE("sys: child_setup after its parent died exits 128 + the death signal", "[sys]") {
  CHECK(sys::orphan_exit_code(SIGKILL) == 137);
  CHECK(sys::orphan_exit_code(SIGHUP) == 129);
  for (const int death_signal : {SIGKILL, SIGHUP}) {
    // A subreaper (this test's child) adopts the orphan, so its exit status can be read: the
    // middle process forks the orphan-to-be and exits before the orphan calls child_setup.
    const int st = in_child([death_signal] {
      ::prctl(PR_SET_CHILD_SUBREAPER, 1);
      const pid_t middle = ::fork();
      if (middle < 0) return 21;
      if (middle == 0) {
        const pid_t me = ::getpid();
        const pid_t orphan = ::fork();
        if (orphan == 0) {
          while (::getppid() == me) ::usleep(1000);  // until the middle has exited
          sys::child_setup(me, death_signal);
          ::_exit(0);  // not reached: the parent is gone
        }
        ::_exit(0);
      }
      int s = 0;
      if (::waitpid(middle, &s, 0) != middle) return 22;
      const pid_t orphan = ::wait(&s);  // the adopted one
      if (orphan <= 0 || !WIFEXITED(s)) return 23;
      return WEXITSTATUS(s);
    });
    REQUIRE(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == sys::orphan_exit_code(death_signal));
  }
}
