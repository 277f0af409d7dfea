// Reads the captured cluster environments of tests/data/cluster-env/*.env (see its README) as
// lookups (support/env_lookup.hpp), for table tests of environment detection (launcher and runtime).
#pragma once

#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "support/env_lookup.hpp"

namespace lspawn::test {

// The variables of task `task` in `file` (a name in tests/data/cluster-env): lines "N: NAME=value"
// of srun --label output for task N, or plain "NAME=value" lines when task < 0.
inline EnvMap cluster_env(const std::string& file, int task = -1) {
  const std::string path = std::string(LSPAWN_CLUSTER_ENV_DIR) + "/" + file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  EnvMap m;
  const std::string label = task >= 0 ? std::to_string(task) + ": " : "";
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, label.size(), label) != 0) continue;
    line = line.substr(label.size());
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  if (m.empty()) throw std::runtime_error("no variables for task " + std::to_string(task) + " in " + path);
  return m;
}

}  // namespace lspawn::test
