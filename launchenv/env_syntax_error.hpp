// EnvSyntaxError: a variable set by a cluster manager (Slurm, Open MPI, Kubernetes) whose value
// does not have the documented form. Thrown by the torch-free parsers of launcher/ and read by
// both the launcher's detection (launch_env.hpp) and the worker runtime (runtime/worker_env.hpp).
#pragma once

#include <stdexcept>
#include <string>

#include "proto/error.hpp"

namespace lspawn {

// what() names the variable, quotes the whole value and says what is wrong where, e.g.
// "SLURM_JOB_NODELIST='n[01-': '[' at offset 1 is never closed".
class EnvSyntaxError : public lspawn::Error {
 public:
  EnvSyntaxError(const std::string& variable, const std::string& value, const std::string& problem)
      : lspawn::Error(variable + "='" + value + "': " + problem), variable_(variable) {}
  const std::string& variable() const { return variable_; }

 private:
  std::string variable_;
};

}  // namespace lspawn
