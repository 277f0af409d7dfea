// Where the workers' output goes in one lspawn run, as the flags send it (docs/cli.md): the
// console (its prefix, --no-prefix, --log-line-prefix-template), --log-dir's files (--tee: the
// console too), torchrun's --redirects/--tee SPEC and --local-ranks-filter (per local rank and
// stream: the console, the files or both) and the --duplicate-*-filters copies.
// make_run_output() builds the sinks; the caller's Supervisor writes to `sinks`, which point
// into the RunOutput: it must outlive that Supervisor (moving it keeps them valid).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/cli_options.hpp"
#include "supervisor/output.hpp"

namespace lspawn::cli {

struct RunOutput {
  std::unique_ptr<ConsoleSink> console;             // null: --log-dir alone sends nothing there
  std::unique_ptr<LogDirSink> logs;                 // --log-dir
  std::unique_ptr<FilteredCopySink> filtered;       // --duplicate-*-filters
  std::vector<std::unique_ptr<OutputSink>> routes;  // --redirects/--tee SPEC/--local-ranks-filter:
                                                    // the console's and the files' share, per rank
  std::vector<OutputSink*> sinks;                   // SupervisorOptions::sinks
  // SupervisorOptions::output_note: where a failed rank's output is when the console does not
  // show it (routed to the files only). Null without routes into --log-dir.
  std::function<std::string(int rank)> output_note;

  // Each restart attempt (round) writes log files of its own (LogDirSink::set_attempt).
  void set_attempt(int round);
};

// `host`: this node's name, in the console's prefix when --nnodes > 1 and in
// --log-line-prefix-template's ${hostname}. `warn` gets a log file's write error (one line).
// Throws UsageError (the flag and the reason) when the --duplicate-*-filters files cannot be
// opened.
RunOutput make_run_output(const CliOptions& o, const std::string& host,
                          const std::function<void(const std::string&)>& warn);

}  // namespace lspawn::cli
