// The server side of the forkserver protocol: the loop that forks workers on request.
//
// Two programs run it. spawn()'s Forkserver forks itself early and runs it (then runs the
// registered function in each worker); `lspawn --start-method forkserver` execs the user's
// program once and the forkserver hook (forkserver_hook.hpp) runs it from a static
// constructor, before main — each worker then returns from the hook and runs main.
//
// Protocol (proto/messages.hpp): ForkRequest frames arrive on the unix stream socket `sock`,
// optionally with the worker's stdout and stderr fds attached (SCM_RIGHTS); each is answered
// by one ForkReply (the worker's pid, or why it was not forked). The server is the parent of
// every worker, so it alone can wait for them: it writes a ChildExit frame on `exits` for each.
// A request with `server` set forks a server of its own instead (its request socket and exit
// pipe attached in place of stdio): a child of this one, in its own process group, killed with
// it, serving the same loop on those fds — the warm daemon gives each run one
// (docs/warm-start.md); its exit is reported on `exits` like a worker's.
//
// The server: PR_SET_PDEATHSIG(SIGKILL) on `owner` (exits at once, 137, if the owner is already
// gone: sys/child_setup.hpp), SIGPIPE ignored, SIGCHLD blocked and read through a signalfd, single-threaded. When
// `sock` reaches EOF or carries a shutdown request, it SIGKILLs the process group of every
// worker still running, reaps them (reporting their exits) and _exits(0).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "proto/messages.hpp"

namespace lspawn::fork_loop {

// Checks a request in the server before it forks; returns why it cannot be served, or "".
using RequestCheck = std::function<std::string(const proto::ForkRequest&)>;

// Called around each fork() of the loop (workers and servers alike), when set: `before` in the
// server just before it, `parent` in the server just after it (also when it failed), `child` in
// the new process once it is set up (a worker: after its process group, signals, stdio,
// environment and working directory; a forked server: before it serves). An interpreter hosting
// the loop needs them (the Python preload server, python_preload_entry.hpp: PyOS_BeforeFork,
// PyOS_AfterFork_Parent, PyOS_AfterFork_Child); unlike pthread_atfork they run for the loop's
// forks only, not for every fork() the worker makes later. Plain C functions: nothing allocates
// around a fork.
struct ForkHooks {
  void (*before)() = nullptr;
  void (*parent)() = nullptr;
  void (*child)() = nullptr;
};

// Runs the server loop. In the server it never returns. It returns in each forked worker,
// with the request that made it, already set up: its own process group (pgid == pid),
// PR_SET_PDEATHSIG(SIGKILL) on the server, SIGPIPE and SIGCHLD at their defaults, the signal
// mask the caller had, stdout/stderr from the request (when it carried them), the environment
// replaced by the request's (when it has one), umask and working directory from the request
// (when given; a directory it cannot enter ends the worker with 126 and a message), and sock,
// exits and the server's own fds closed; `hooks` run around each fork (see ForkHooks).
proto::ForkRequest serve(int sock, int exits, pid_t owner, const RequestCheck& check, const ForkHooks& hooks = {});

}  // namespace lspawn::fork_loop
