// lspawn 0.1's header paths, from before launcher/ was split into parts: each still compiles
// through the forwarding header installed at the old path (cmake/install.cmake), and the parts'
// own targets (lspawn::launchenv here) are exported.
#include "launcher/launch_env.hpp"   // now launchenv/launch_env.hpp
#include "launcher/spawn/options.hpp"  // now spawn/options.hpp
#include "launcher/sys.hpp"          // now sys/sys.hpp

#include <cstdio>

int check_old_paths() {
  lspawn::SpawnOptions o;
  const int port = lspawn::slurm_default_port(42);
  const bool ok = port == 15042 && !o.nprocs.has_value();
  std::printf("old header paths: slurm_default_port(42) = %d\n", port);
  return ok ? 0 : 1;
}
