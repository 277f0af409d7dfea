// `lspawn status PID`: the hang report of a running lspawn job, on the caller's stdout.
//
// Finds the job's status directory through /proc/PID/fd (lspawn keeps an O_PATH handle on it, so
// only a user allowed to inspect that process finds it; no file outside the job's private run
// directory names it), reads every rank's record there, asks the ranks behind for their stacks,
// and prints the same report lspawn prints on SIGURG. The job goes on.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace lspawn {

// The status directory of lspawn process `pid`, or nullopt (not an lspawn job, gone, or not
// inspectable by this user).
std::optional<std::string> find_status_dir(pid_t pid);

// `args`: what follows "status". Returns the exit status: 0 report printed, 2 usage, 1 no such job.
int run_status_command(const std::vector<std::string>& args);

// Name of the status directory inside a run directory.
inline constexpr const char* kStatusDirName = "lspawn-status";

}  // namespace lspawn
