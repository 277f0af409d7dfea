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
// This is process-wide state (the program image, the forkserver), set once from main; what
// lspawn's own code reads of it is spawn/init_detail.hpp (not part of <lspawn/spawn.hpp>).
#pragma once

namespace lspawn {

struct StartupOptions {
  // Fork the forkserver now, so StartMethod::Forkserver is safe after threads start later.
  bool start_forkserver = false;
};

void init(int argc, char** argv, const StartupOptions& opts = {});

}  // namespace lspawn
