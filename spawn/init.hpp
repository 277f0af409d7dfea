// lspawn::init(): the first line of main() in a program that calls spawn().
//
// In the caller: records the program image (for StartMethod::Spawn, which re-executes it with
// the same argv) and, with StartupOptions::start_forkserver, forks the forkserver while the
// process is still single-threaded. Returns normally.
// In a worker started by StartMethod::Spawn (environment LSPAWN_SPAWN_CALL names its
// SpawnCall file): runs the registered function with its decoded arguments, writes the result
// or the error report, and exits the process (status 0, or 1 after an exception). It does not
// return: code after init() in main runs only in the caller. This is the one place lspawn ends
// a process itself, and only a worker process.
//
// This is process-wide state (the program image, the forkserver), set once from main.
#pragma once

namespace lspawn {

class Forkserver;

struct StartupOptions {
  // Fork the forkserver now, so StartMethod::Forkserver is safe after threads start later.
  bool start_forkserver = false;
};

void init(int argc, char** argv, const StartupOptions& opts = {});

// The environment variable naming a Spawn worker's SpawnCall file (set by spawn(), removed
// from the environment by init() before the function runs).
inline constexpr const char* kSpawnCallEnv = "LSPAWN_SPAWN_CALL";

namespace init_detail {
// True once init() ran in this process (StartMethod::Spawn requires it).
bool initialized();
// The executable (/proc/self/exe at init) and argv recorded by init().
const char* executable();
int argc();
char* const* argv();
// The forkserver init() started, or null.
Forkserver* default_forkserver();
// Threads the process ran when init() was called (1 without init). Threads that exist before
// main are started by libraries as they load (OpenBLAS's pthread pool, for one) and handle
// fork themselves (pthread_atfork); the Fork guard counts only the threads started since.
int thread_baseline();
}  // namespace init_detail

}  // namespace lspawn
