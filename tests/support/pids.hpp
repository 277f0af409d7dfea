// Whether processes a test started (or their orphans) still run, from /proc; the subreaper that
// lets a test reap the orphans. Tests only.
#pragma once

#include <chrono>
#include <set>

#include <sys/types.h>

namespace lspawn::test {

// True while `pid` exists and is not a zombie (reads /proc/<pid>/stat): an orphan reparented
// to a pid 1 that never reaps it does not count.
bool alive(pid_t pid);

// While it lives, this process is a child subreaper (PR_SET_CHILD_SUBREAPER): orphans of what a
// test started come to it, so that alive_after() reaps them instead of seeing zombies it cannot
// reap. Destruction reaps every child left and turns it off. Throws std::system_error.
class Subreaper {
 public:
  Subreaper();
  ~Subreaper();
  Subreaper(const Subreaper&) = delete;
  Subreaper& operator=(const Subreaper&) = delete;
};

// Waits up to `limit` for every pid of `pids` to be gone (reaping those that are our children,
// e.g. orphans reparented to a subreaper test); returns the ones still alive.
std::set<pid_t> alive_after(const std::set<pid_t>& pids, std::chrono::milliseconds limit);

}  // namespace lspawn::test
