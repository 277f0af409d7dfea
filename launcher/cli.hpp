// The lspawn command: parse the command line, check the program and the port, start the
// workers under a Supervisor, print the summary. The `lspawn` binary is this plus main().
#pragma once

#include <vector>
#include <string>

namespace lspawn {

// Runs `lspawn args...` (args without argv[0]) and returns the exit status
// (docs/exit-codes.md). Writes workers' output and lspawn's messages to fds 1 and 2.
// Expects SIGPIPE ignored (main() does it). Never calls exit().
int run_cli(const std::vector<std::string>& args);

}  // namespace lspawn
