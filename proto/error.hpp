// lspawn::Error: the base of every exception lspawn throws, so that a program can catch all of
// lspawn's failures in one clause (`catch (const lspawn::Error& e)`) and nothing else's. It is a
// std::runtime_error: what() is the message, which names what was wrong (the flag, variable,
// rank, host:port or timeout). Each part derives the kind it throws (SysError, WireError,
// SpawnError, CollectiveError, ...; docs/error-reports.md lists them).
//
// Here, in proto/, because proto is the bottom layer: every part may include it.
#pragma once

#include <stdexcept>

namespace lspawn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace lspawn
