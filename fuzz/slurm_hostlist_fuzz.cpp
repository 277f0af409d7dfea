// Fuzzes slurm::expand_hostlist / first_host: any input either expands (within the host limit,
// first_host agreeing with the expansion, every name non-empty) or throws EnvSyntaxError naming
// the variable. Anything else (another exception, a crash, a sanitizer report) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "launchenv/slurm_hostlist.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  constexpr size_t kLimit = 4096;  // small: keeps each run fast; the limit path is exercised too
  try {
    const auto hosts = lspawn::slurm::expand_hostlist(text, "SLURM_JOB_NODELIST", kLimit);
    if (hosts.empty() || hosts.size() > kLimit) std::abort();
    for (const auto& h : hosts) {
      if (h.empty()) std::abort();
    }
    try {
      if (lspawn::slurm::first_host(text, "SLURM_JOB_NODELIST") != hosts.front()) std::abort();
    } catch (const lspawn::EnvSyntaxError&) {
      // only the (larger) default limit may differ from kLimit, and it is larger: never throws
      std::abort();
    }
  } catch (const lspawn::EnvSyntaxError& e) {
    if (e.variable() != "SLURM_JOB_NODELIST") std::abort();
  }
  return 0;
}
