// Fuzzes slurm::expand_tasks_per_node: any input either expands to 1..kMaxNodeEntries counts in
// 0..1'000'000 or throws EnvSyntaxError naming the variable.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "launchenv/slurm_tasks_per_node.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto counts = lspawn::slurm::expand_tasks_per_node(text, "SLURM_TASKS_PER_NODE");
    if (counts.empty() || counts.size() > lspawn::slurm::kMaxNodeEntries) std::abort();
    for (int c : counts) {
      if (c < 0 || c > 1'000'000) std::abort();
    }
  } catch (const lspawn::EnvSyntaxError& e) {
    if (e.variable() != "SLURM_TASKS_PER_NODE") std::abort();
  }
  return 0;
}
