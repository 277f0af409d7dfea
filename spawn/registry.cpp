#include "spawn/registry.hpp"

#include <stdexcept>

namespace lspawn {

namespace registry_detail {
void check_arity(const proto::ValueList& args, size_t expected) {
  if (args.size() != expected) {
    throw CodecError("spawn call carries " + std::to_string(args.size()) +
                     " arguments, the registered function takes " + std::to_string(expected) + " after the index");
  }
}
}  // namespace registry_detail

FunctionRegistry& FunctionRegistry::global() {
  static FunctionRegistry registry;  // constructed on first use: safe during static init
  return registry;
}

void FunctionRegistry::add(const std::string& name, FunctionAddress address, Invoker invoker) {
  auto [it, inserted] = by_name_.emplace(name, Entry{address, std::move(invoker)});
  if (!inserted && it->second.address != address) {
    throw std::logic_error("LSPAWN_REGISTER(" + name + "): the name is already registered for another function");
  }
}

const Invoker* FunctionRegistry::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second.invoker;
}

std::optional<std::string> FunctionRegistry::name_of(FunctionAddress address) const {
  for (const auto& [name, entry] : by_name_) {
    if (entry.address == address) return name;
  }
  return std::nullopt;
}

std::string FunctionRegistry::names() const {
  std::string out;
  for (const auto& [name, entry] : by_name_) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out.empty() ? "(none)" : out;
}

}  // namespace lspawn
