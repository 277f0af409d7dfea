// An environment for the pure functions that read one through a lookup (resolve_launch(),
// parse_cli(args, env), WorkerEnv::from_lookup(), hosts::rsh_command()): a map as that lookup.
// Tests only.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace lspawn::test {

using EnvMap = std::map<std::string, std::string>;

// A lookup that returns m's value of a name, nullopt for a name m does not have.
inline std::function<std::optional<std::string>(const std::string&)> lookup_of(const EnvMap& m) {
  return [m](const std::string& name) -> std::optional<std::string> {
    auto it = m.find(name);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace lspawn::test
