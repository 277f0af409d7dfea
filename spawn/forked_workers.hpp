// ForkedWorkers: the workers one Forkserver forks for one Supervisor.
//
// The server is the workers' parent, so only it can wait for them: the supervisor adopts each
// one (Supervisor::adopt: its output on pipes, its process group signalled) and their exits
// arrive as ChildExit frames on the server's exit pipe, which ForkedWorkers watches in the
// supervisor's loop and turns into Supervisor::notify_exit(). When the pipe reaches EOF — the
// server died, and its workers with it (PR_SET_PDEATHSIG) — every worker not yet reported is
// reported killed by SIGKILL.
//
// Used by spawn() (StartMethod::Forkserver) and `lspawn --start-method forkserver`.
// Ownership: server and supervisor are borrowed. Call unwatch() before the server's exit pipe
// closes or the supervisor goes; nothing happens on destruction.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "spawn/forkserver.hpp"
#include "supervisor/supervisor.hpp"
#include "proto/messages.hpp"

namespace lspawn {

class ForkedWorkers {
 public:
  // `noun` names a worker in error contexts ("process" for spawn(), "rank" for the CLI).
  // `on_server_death` (may be empty) gets one line when the server dies with workers unreported.
  ForkedWorkers(Forkserver& server, Supervisor& sup, std::string noun,
                std::function<void(const std::string&)> on_server_death = {});

  // Asks the server for a worker running `call` with environment `env`, its stdout/stderr on
  // new pipes, and adopts it as worker `id` (its own process group). Returns its pid. Throws
  // what Forkserver::fork_worker and the supervisor throw.
  pid_t start(int id, const proto::SpawnCall& call, const std::vector<std::string>& env, std::string error_file);

  // Stops watching the server's exit pipe. Idempotent.
  void unwatch();

  // Reports every worker whose exit is still unreported as killed by SIGKILL (after the server
  // was shut down: it killed them, and its exit pipe is gone).
  void report_all_killed();

 private:
  void on_exits();

  Forkserver& server_;
  Supervisor& sup_;
  std::string noun_;
  std::function<void(const std::string&)> on_server_death_;
  std::map<pid_t, int> unreported_;  // worker pid -> id
  bool watching_ = false;
};

}  // namespace lspawn
