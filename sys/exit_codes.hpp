// The exit statuses of the lspawn binary (docs/exit-codes.md), and the error that means kUsage.
//
// Here, below every part of the launcher, because the parts that decide them live below the
// command line: the node group says kNodeLost, the daemon kInternal, `lspawn status` kUsage,
// cluster detection throws UsageError.
#pragma once

#include <stdexcept>

#include "proto/error.hpp"

namespace lspawn {

// A worker's own exit code (or 128+N for its signal N) is passed through when that worker is
// the root cause.
namespace exit_codes {
inline constexpr int kSuccess = 0;
inline constexpr int kUsage = 2;            // bad option, port in use, log dir unusable
inline constexpr int kRendezvous = 122;     // the nodes of a multi-node job did not meet
inline constexpr int kNodeLost = 123;       // a node of the job was lost (its lspawn or link)
inline constexpr int kHang = 124;           // --hang-timeout: no rank made progress (as timeout(1))
inline constexpr int kInternal = 125;       // lspawn itself failed (fork, pipe, ...)
inline constexpr int kCannotExecute = 126;  // program found but not executable
inline constexpr int kNotFound = 127;       // program not found
}  // namespace exit_codes

// A command line (or a command line with its environment) lspawn cannot accept. what() names
// the option or variable and the accepted form.
class UsageError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

}  // namespace lspawn
