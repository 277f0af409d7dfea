// One run of `lspawn PROGRAM` once the command line is settled (cli.cpp: parsed, torchrun's
// conventions applied): resolve the program, form the node group, make the run directory and
// the output sinks, start the workers (exec'd, or forked by a forkserver), drive the rounds
// (restarts, elastic rounds) with the other nodes, print the outcome.
// Every way out leaves no worker running and no run directory behind, in this order: the
// forkserver closes (its server kills what it forked) before the Supervisor goes (it SIGKILLs
// and reaps what is left), the Supervisor before the sinks it writes to, and the run directory
// is removed before the node group's channel closes.
#pragma once

#include "launcher/cli_options.hpp"

namespace lspawn::cli {

// Runs the job and returns lspawn's exit status (docs/exit-codes.md); says why on stderr when
// the run cannot start. Throws what an unexpected system error throws (run_cli reports it as
// an internal error).
int run_job(const CliOptions& o);

}  // namespace lspawn::cli
