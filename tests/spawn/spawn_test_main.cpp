// Main of the spawn() tests: lspawn::init() must run first, because StartMethod::Spawn
// re-executes this binary (the worker runs its function inside init() and exits), and the
// forkserver must be forked before Catch or a test starts a thread.
#define CATCH_CONFIG_RUNNER
// Catch's implementation instantiates std::regex, in which GCC 12 under ASan reports a false
// -Wmaybe-uninitialized (libstdc++'s code, not ours).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <catch2/catch.hpp>

#include "spawn/init.hpp"

int main(int argc, char** argv) {
  lspawn::StartupOptions opts;
  opts.start_forkserver = true;
  lspawn::init(argc, argv, opts);
  return Catch::Session().run(argc, argv);
}
