#include "spawn/python_preload_entry.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include "spawn/fork_loop.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/forkserver_handshake.hpp"
#include "spawn/threads.hpp"

namespace {

using lspawn::forkserver_handshake::Fds;

// LSPAWN_FORKSERVER_FDS, taken (and unset) on first use.
std::optional<Fds> g_fds;
bool g_taken = false;

int failed(char* err, size_t err_len, const std::string& why) {
  if (err && err_len > 0) std::snprintf(err, err_len, "%s", why.c_str());
  return -1;
}

// The fds, or a reason in *why.
std::optional<Fds> fds(std::string* why) {
  if (!g_taken) {
    g_taken = true;
    try {
      g_fds = lspawn::forkserver_handshake::take_fds();
    } catch (const std::exception& e) {
      *why = e.what();
      return std::nullopt;
    }
  }
  if (!g_fds) {
    *why = std::string(lspawn::kForkserverFdsEnv) + " is not set: this server is started by lspawn --preload only";
  }
  return g_fds;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int lspawn_preload_threads(void) { return lspawn::count_threads(); }

__attribute__((visibility("default"))) int lspawn_preload_threads_after_fork(void) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  if (pid < 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return lspawn::count_threads();
}

__attribute__((visibility("default"))) int lspawn_preload_refuse(const char* why, char* err, size_t err_len) {
  std::string problem;
  const auto f = fds(&problem);
  if (!f) return failed(err, err_len, problem);
  try {
    lspawn::forkserver_handshake::answer(*f, why && *why ? why : "refused (no reason given)");
  } catch (const std::exception& e) {
    return failed(err, err_len, e.what());
  }
  return 0;
}

__attribute__((visibility("default"))) int lspawn_preload_serve(void (*before)(void), void (*parent)(void),
                                                                void (*child)(void), char* err, size_t err_len) {
  std::string problem;
  const auto f = fds(&problem);
  if (!f) return failed(err, err_len, problem);
  try {
    lspawn::forkserver_handshake::answer(*f, "");
  } catch (const std::exception& e) {
    return failed(err, err_len, e.what());
  }
  lspawn::fork_loop::ForkHooks hooks;
  hooks.before = before;
  hooks.parent = parent;
  hooks.child = child;
  lspawn::fork_loop::serve(f->requests, f->exits, ::getppid(), nullptr, hooks);
  return 0;  // a worker
}

}  // extern "C"
