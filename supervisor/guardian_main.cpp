// lspawn-guardian: the process of a Guardian (guardian.hpp), started by posix_spawn with its
// channel on fd 3. A small program, so that starting it costs an exec, not a fork of the
// (possibly large, LibTorch-loaded) owner — nor a copy-on-write share of the owner's memory for
// as long as it runs. Not meant to be run by hand.
#include <sys/mman.h>

#include "supervisor/guardian.hpp"
#include "supervisor/guardian_loop.hpp"

int main() {
  const int rfd = lspawn::guardian_detail::become_guardian(3);
  void* table = ::mmap(nullptr, sizeof(pid_t) * lspawn::Guardian::kMaxGroups, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (table == MAP_FAILED) return 1;
  lspawn::guardian_detail::guardian_loop(rfd, static_cast<pid_t*>(table), lspawn::Guardian::kMaxGroups);
}
