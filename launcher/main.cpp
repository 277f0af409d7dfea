// The lspawn binary: the launcher library plus this main().
#include <csignal>
#include <string>
#include <vector>

#include "launcher/cli.hpp"

int main(int argc, char** argv) {
  // A console reader that goes away (lspawn ... | head) must not kill the supervisor: writes
  // then fail with EPIPE and that console stream is dropped. Workers get SIGPIPE back.
  std::signal(SIGPIPE, SIG_IGN);
  return lspawn::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
