#include "spawn/forked_workers.hpp"

#include <poll.h>
#include <signal.h>

#include <utility>

#include "sys/sys.hpp"

namespace lspawn {
namespace {

// A wait status as waitpid would have produced it, from a forkserver's ChildExit.
int wait_status_of(const proto::ChildExit& e) {
  return e.signal != 0 ? (e.signal & 0x7f) : ((e.exit_code & 0xff) << 8);
}

}  // namespace

ForkedWorkers::ForkedWorkers(Forkserver& server, Supervisor& sup, std::string noun,
                             std::function<void(const std::string&)> on_server_death)
    : server_(server), sup_(sup), noun_(std::move(noun)), on_server_death_(std::move(on_server_death)) {}

pid_t ForkedWorkers::start(int id, const proto::SpawnCall& call, const std::vector<std::string>& env,
                           std::string error_file) {
  const std::string ctx = noun_ + " " + std::to_string(id);
  sys::Pipe out = sys::make_pipe("stdout of " + ctx);
  sys::Pipe err = sys::make_pipe("stderr of " + ctx);
  const pid_t pid = server_.fork_worker(call, env, out.write.get(), err.write.get());
  out.write.reset();
  err.write.reset();
  unreported_[pid] = id;
  sup_.adopt(id, pid, pid, std::move(out.read), std::move(err.read), std::move(error_file));
  if (!watching_) {
    sup_.watch_fd(server_.exit_fd(), POLLIN, [this](short) { on_exits(); });
    watching_ = true;
  }
  return pid;
}

void ForkedWorkers::unwatch() {
  if (!watching_) return;
  sup_.unwatch_fd(server_.exit_fd());
  watching_ = false;
}

void ForkedWorkers::report_all_killed() {
  for (const auto& [pid, id] : unreported_) sup_.notify_exit(id, SIGKILL);
  unreported_.clear();
}

void ForkedWorkers::on_exits() {
  bool gone = false;
  for (const auto& e : server_.read_exits(&gone)) {
    auto it = unreported_.find(static_cast<pid_t>(e.pid));
    if (it == unreported_.end()) continue;  // a worker of an earlier spawn() on this server
    const int id = it->second;
    unreported_.erase(it);
    sup_.notify_exit(id, wait_status_of(e));
  }
  if (gone) {
    unwatch();
    if (!unreported_.empty() && on_server_death_) {
      on_server_death_("the forkserver (pid " + std::to_string(server_.pid()) +
                       ") died; its workers died with it (SIGKILL)");
    }
    report_all_killed();
  }
}

}  // namespace lspawn
