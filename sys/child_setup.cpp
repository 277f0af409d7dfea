#include "sys/child_setup.hpp"

#include <sys/prctl.h>
#include <unistd.h>

namespace lspawn::sys {

void child_setup(pid_t parent, int death_signal, ChildGroup group) noexcept {
  if (group == ChildGroup::kOwn) ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, death_signal);
  if (::getppid() != parent) ::_exit(orphan_exit_code(death_signal));  // it died before prctl
}

}  // namespace lspawn::sys
