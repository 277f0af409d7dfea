// Guardian: a tiny process that kills every worker process group when its owner dies.
//
// Why: PR_SET_PDEATHSIG kills a worker when lspawn dies, but not the worker's own children.
// The guardian is started when Guardian is constructed, puts itself in its own process group
// (so a kill of the owner's group does not take it too), and reads pgids from a socket whose
// only writer is the owner. When the socket reaches EOF without a clean-shutdown message — the
// owner died, even by SIGKILL — it SIGKILLs every registered process group, removes the
// directory tree its owner gave it (remove_on_owner_death: a run's private directory), and exits.
//
// How it starts: posix_spawn (vfork + exec, no copy of the owner's page tables) of the small
// `lspawn-guardian` program (guardian_main.cpp), found at $LSPAWN_GUARDIAN, else beside the
// running program (install_layout.hpp: $LSPAWN_HOME, the install tree, a wheel's package, the
// build tree; nothing absolute is written into the binary) — see find_program(). When
// none is there or it cannot be executed, the guardian is a fork() of the owner instead, with
// the same behaviour: only slower to start in a large process, and it shares the owner's memory
// copy-on-write for as long as it lives.
//
// Caller's duties:
//   - construct it before any thread exists (the fork fallback's child is allocation-free, but
//     fork in a threaded process is still best avoided);
//   - a child that does not exec (fork-callable worker) must close write_fd() after fork, or
//     the guardian never sees EOF; exec'd children lose it by O_CLOEXEC;
//   - register each worker's pgid right after fork (register_group), unregister it once the
//     group is known empty (unregister_group), and call shutdown() (or destroy) on a clean end.
//
// The guardian holds up to kMaxGroups groups at once; registering more throws.
#pragma once

#include <sys/types.h>

#include <string>

#include "sys/sys.hpp"

namespace lspawn {

class Guardian {
 public:
  static constexpr int kMaxGroups = 1 << 16;

  // Starts the guardian (lspawn-guardian, else a fork). Throws SysError if socketpair/fork fails.
  Guardian();
  // Clean shutdown (registered groups are NOT killed) and reaps the guardian.
  ~Guardian();
  Guardian(const Guardian&) = delete;
  Guardian& operator=(const Guardian&) = delete;

  // Adds / removes a process group the guardian will SIGKILL if the owner dies.
  void register_group(pid_t pgid);
  void unregister_group(pid_t pgid);

  // The directory tree (absolute path) the guardian removes, after the kills, if the owner dies;
  // on a clean end the owner removes it. One: a later call replaces it. Throws
  // std::invalid_argument naming `dir` when it is not absolute or not shorter than PATH_MAX.
  void remove_on_owner_death(const std::string& dir);
  // Tells the guardian to exit without killing or removing anything, and reaps it. Idempotent.
  void shutdown();

  pid_t pid() const { return pid_; }
  // The program the guardian runs; empty when it is a fork of the owner.
  const std::string& program() const { return program_; }

  // The lspawn-guardian program to start: $LSPAWN_GUARDIAN when set (empty: fork instead), else
  // the one beside the running program (install_layout.hpp), when executable; else "" (fork).
  static std::string find_program();
  // Owner end of the guardian channel (O_CLOEXEC). Close it in forked children that do not exec.
  int write_fd() const { return pipe_.get(); }

 private:
  void send(int32_t value);
  void send_bytes(const void* data, size_t n);
  pid_t pid_ = -1;
  sys::Fd pipe_;
  std::string program_;
};

}  // namespace lspawn
