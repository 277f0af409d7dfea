// The lspawn binary: the launcher library plus this main().
#include <csignal>
#include <string>
#include <vector>

#include <fcntl.h>

#include "launcher/cli.hpp"

int main(int argc, char** argv) {
  // fds 0-2 must be open, or a pipe created later could take number 1 or 2 and be lost in
  // the child's dup2 dance.
  for (int fd = 0; fd < 3; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", O_RDWR);  // takes the lowest free number
  }
  // A console reader that goes away (lspawn ... | head) must not kill the supervisor: writes
  // then fail with EPIPE and that console stream is dropped. Workers get SIGPIPE back.
  std::signal(SIGPIPE, SIG_IGN);
  return lspawn::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
