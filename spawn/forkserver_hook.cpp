#include "spawn/forkserver_hook.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "spawn/fork_loop.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/forkserver_handshake.hpp"
#include "spawn/threads.hpp"

namespace {

// An ELF note (name "lspawn", type 1): lspawn looks for its section in the program's file.
struct ForkserverNote {
  uint32_t namesz, descsz, type;
  char name[8];
  uint32_t desc;
};

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "lspawn forkserver hook (pid %d): %s\n", static_cast<int>(::getpid()), why.c_str());
  std::fflush(stderr);
  ::_exit(125);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAlwaysFullExit = true;  // LeakSanitizer's check runs at exit
#else
constexpr bool kAlwaysFullExit = false;
#endif

// Set in each forked worker when its exit skips the libraries' static destructors.
bool g_fast_exit = false;

// Registered (on_exit) before the program's own static objects are constructed, so at exit it
// runs after their destructors and those of main's function-local statics, and before the
// destructors of the shared libraries' static objects, which it skips: they were built once, in
// the forkserver, and destroying LibTorch's (its operator registry) costs ~0.2 s of CPU per
// worker. As multiprocessing's fork children do (os._exit after the function returns).
void fast_exit(int status, void*) {
  if (!g_fast_exit) return;
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  std::fflush(nullptr);
  ::_exit(status);
}

}  // namespace

// Priority 101: before the program's (default-priority) static constructors.
__attribute__((constructor(101))) static void lspawn_forkserver_register_fast_exit() {
  if (kAlwaysFullExit) return;
  const char* fast = std::getenv(lspawn::kForkserverFastExitEnv);
  if (std::getenv(lspawn::kForkserverFdsEnv) && !(fast && std::strcmp(fast, "0") == 0)) {
    ::on_exit(fast_exit, nullptr);
  }
}

extern "C" {
__attribute__((section(".note.lspawn.forkserver"), used, aligned(4)))
const ForkserverNote lspawn_forkserver_note = {7, 4, 1, {'l', 's', 'p', 'a', 'w', 'n', 0, 0}, 1};

int lspawn_forkserver_hook_anchor = 0;
}

__attribute__((constructor)) static void lspawn_forkserver_hook() {
  std::optional<lspawn::forkserver_handshake::Fds> fds;
  try {
    fds = lspawn::forkserver_handshake::take_fds();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  if (!fds) return;
  const int threads = lspawn::count_threads();
  std::string refusal;
  if (threads != 1) {
    refusal = std::to_string(threads) +
              " threads run after the program's static initialisation; forking workers "
              "from it is unsafe (use --start-method exec)";
  }
  try {
    lspawn::forkserver_handshake::answer(*fds, refusal);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  if (!refusal.empty()) ::_exit(125);
  lspawn::fork_loop::serve(fds->requests, fds->exits, ::getppid(), nullptr);
  g_fast_exit = true;
  // A worker from here on: the rest of static initialisation, then main().
}
