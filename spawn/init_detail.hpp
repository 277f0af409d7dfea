// What lspawn's own code (spawn(), the forkserver) reads of the process-wide state that
// lspawn::init() records (spawn/init.hpp). Not part of the public face: <lspawn/spawn.hpp> does
// not include it, and no user code needs it.
#pragma once

namespace lspawn {

class Forkserver;

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
