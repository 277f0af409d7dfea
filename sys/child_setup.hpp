// The first steps of every child lspawn forks — a worker (Supervisor, fork loop), a forkserver, a
// server forked by the fork loop, the remote shell of a --hostfile node — written once.
//
// A child of lspawn must never outlive the process that started it: it gets a death signal
// (prctl PR_SET_PDEATHSIG) for when that parent dies, and, since the parent may already have
// died between fork() and prctl(), it then checks that its parent is still `parent`. If not, it
// exits at once with one rule for every child: **128 + the death signal**, the status a shell
// reports for a child that signal killed (137 for SIGKILL, 129 for SIGHUP): the same end the
// death signal would have given it a moment later.
//
// Unless told otherwise it first leaves its parent's process group (setpgid(0, 0)): terminal
// signals (^C) go to lspawn, which stops workers gracefully, and lspawn signals each child's
// group as a whole. The parent calls setpgid(pid, pid) too, so the group exists whichever runs
// first.
//
// Only async-signal-safe system calls: callable between fork() and exec in a process that runs
// threads.
#pragma once

#include <csignal>
#include <sys/types.h>

namespace lspawn::sys {

enum class ChildGroup {
  kOwn,      // setpgid(0, 0): a process group of its own
  kInherit,  // stays in the parent's group (a fork loop serving its own caller)
};

// Call first thing in the child after fork(). `parent`: the pid of the forking process, read
// before fork(). Returns only if the parent is alive.
void child_setup(pid_t parent, int death_signal = SIGKILL, ChildGroup group = ChildGroup::kOwn) noexcept;

// The exit status child_setup() uses when the parent is already gone: 128 + death_signal.
constexpr int orphan_exit_code(int death_signal) { return 128 + death_signal; }

}  // namespace lspawn::sys
