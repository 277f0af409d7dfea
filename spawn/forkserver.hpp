// Forkserver: a process that forks workers on request. Two kinds:
//   - start(): spawn()'s server, a fork of the calling program made early (before threads
//     exist); each worker runs a function registered with LSPAWN_REGISTER.
//   - exec(): `lspawn --start-method forkserver`'s server, the user's program executed once; its
//     forkserver hook (forkserver_hook.hpp, linked in by lspawn_runtime) serves requests from a
//     static constructor, after the dynamic loader and every library's static initialisation
//     (LibTorch's ~0.5 s) ran once; each worker returns from the hook and runs main.
//
// Why: forking a process that runs threads (LibTorch's pools, a process group's gloo threads)
// copies only the calling thread and whatever locks the others held; the child may deadlock.
// The server is forked while the program is still single-threaded, stays single-threaded, and
// forks each worker from that clean state. Workers then start in parallel: a request costs one
// fork() in the server (~1 ms); the worker's own start-up runs concurrently with the next one.
//
// Protocol (proto/messages.hpp; server side in fork_loop.hpp): the owner writes ForkRequest frames on a unix stream socket,
// optionally with the worker's stdout and stderr fds attached (SCM_RIGHTS); the server answers
// each with one ForkReply (the worker's pid, or why the fork failed). The server is the parent
// of every worker, so it alone can wait for them: it reports each exit as a ChildExit frame on a
// separate pipe (exit_fd()), which the owner polls with its other fds.
//
// Each worker runs in its own process group (pgid == pid), has PR_SET_PDEATHSIG(SIGKILL) on the
// server, and runs the function registered (LSPAWN_REGISTER) under SpawnCall.function via
// run_worker(). The server has PR_SET_PDEATHSIG(SIGKILL) on its owner and exits, killing the
// groups of every worker still running, when the request socket reaches EOF (owner gone or
// Forkserver destroyed): no worker outlives the owner, whatever kills it.
//
// Thread-safety: fork_worker() and read_exits() may be called from one thread at a time.
// One spawn() at a time uses a server (spawn() holds it for the life of its ProcessContext).
#pragma once

#include <sys/types.h>

#include <signal.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sys/sys.hpp"
#include "proto/messages.hpp"
#include "proto/error.hpp"

namespace lspawn {

// Names the two fds an exec'd forkserver serves on: "REQUEST_SOCKET,EXIT_PIPE".
inline constexpr const char* kForkserverFdsEnv = "LSPAWN_FORKSERVER_FDS";

// Forkserver::exec() was interrupted by signal `sig` before the server was ready.
class ForkserverInterrupted : public lspawn::Error {
 public:
  explicit ForkserverInterrupted(int sig) : lspawn::Error("interrupted by signal " + std::to_string(sig)), sig_(sig) {}
  int signal() const { return sig_; }

 private:
  int sig_;
};

class Forkserver {
 public:
  // Forks the server now. Call it while the process is single-threaded (first thing in main,
  // or via lspawn::init()); when other threads already run it still starts but warns on stderr
  // with their count. Throws sys::SysError when socketpair/pipe/fork fails.
  static std::unique_ptr<Forkserver> start();

  // Executes `path` (argv with argv[0]; env "NAME=value", the whole environment) as a
  // forkserver: in its own process group, stdin from /dev/null, the caller's stdout/stderr,
  // only fds 0-2 and its two protocol fds (named by LSPAWN_FORKSERVER_FDS) open,
  // PR_SET_PDEATHSIG(SIGKILL) on the caller. Returns once it said it is ready. Throws
  // SpawnError naming the program when it cannot be executed, exits or refuses (its reason,
  // e.g. threads running after static initialisation) before it is ready, or is not ready
  // within `ready_timeout` (it is killed). A signal of `interrupt` (blocked by the caller)
  // arriving while waiting kills it and throws ForkserverInterrupted.
  static std::unique_ptr<Forkserver> exec(const std::string& path, const std::vector<std::string>& argv,
                                          const std::vector<std::string>& env, std::chrono::milliseconds ready_timeout,
                                          const sigset_t* interrupt = nullptr);

  // A server this process did not start, handed over with its two fds (the warm daemon's
  // per-run server, docs/warm-start.md): `requests` its request socket, `exits` the read end
  // of its exit pipe. It is not this process's child: the destructor does not reap it but
  // waits (up to 10 s) for its exit pipe's EOF, i.e. until it killed its workers and exited.
  static std::unique_ptr<Forkserver> attach(pid_t pid, sys::Fd requests, sys::Fd exits);

  // Closes the request socket (the server kills any worker still running and exits) and reaps
  // the server (an attached one: waits for its exit pipe's EOF). Never throws.
  ~Forkserver();
  Forkserver(const Forkserver&) = delete;
  Forkserver& operator=(const Forkserver&) = delete;

  // Asks the server to fork a worker running `call` with environment `env` ("NAME=value",
  // replaces the server's environment entirely when non-empty). stdout_fd/stderr_fd (-1 for
  // both: inherit the server's) become the worker's fds 1 and 2. Returns the worker's pid
  // (also its pgid). Throws SpawnError with the server's reason when the fork failed, and
  // sys::SysError / wire::WireError when the server is gone.
  pid_t fork_worker(const proto::SpawnCall& call, const std::vector<std::string>& env, int stdout_fd = -1,
                    int stderr_fd = -1);

  // Asks the server to fork a server of its own (a child of it, same memory, same loop; its
  // exit is reported on exit_fd() like a worker's). Returns its pid and the fds to drive it
  // with: its request socket and the read end of its exit pipe (blocking). Throws like
  // fork_worker.
  struct Handle {
    pid_t pid = -1;
    sys::Fd requests;
    sys::Fd exits;
  };
  Handle fork_server();

  // The working directory and umask of the workers forked from now on ("" / -1: the server's).
  // A server executed or forked for another process's run needs that run's.
  void set_worker_context(std::string cwd, int umask) {
    worker_cwd_ = std::move(cwd);
    worker_umask_ = umask;
  }

  // Non-blocking fd, readable when ChildExit frames (or EOF: the server died) are pending.
  int exit_fd() const { return exits_.get(); }

  // Reads every ChildExit frame available now without blocking. Sets *server_gone when the
  // exit pipe reached EOF (the server died: its remaining workers are dead too).
  std::vector<proto::ChildExit> read_exits(bool* server_gone = nullptr);

  pid_t pid() const { return pid_; }
  // The process that started the server; only it may use this object (a forked copy may not).
  pid_t owner() const { return owner_; }

  // The exits of a server's workers are read by one ProcessContext at a time: it leases the
  // server for its life. try_lease() returns false when another context holds it.
  bool try_lease() {
    if (leased_) return false;
    leased_ = true;
    return true;
  }
  void end_lease() { leased_ = false; }

 private:
  Forkserver(pid_t pid, sys::Fd requests, sys::Fd exits);
  // Sends `req` with fds a and b attached (when both >= 0) and reads the reply.
  proto::ForkReply request(const proto::ForkRequest& req, int a, int b, const std::string& context);
  pid_t pid_;
  bool attached_ = false;  // not our child (attach())
  std::string worker_cwd_;
  int worker_umask_ = -1;
  pid_t owner_;
  sys::Fd requests_;
  sys::Fd exits_;
  std::string exit_buf_;
  bool leased_ = false;
};

}  // namespace lspawn
