// The command line: parse_cli accepts it or throws UsageError, nothing else.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "launcher/cli_options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // NUL-separated arguments.
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.emplace_back();
    } else {
      args.back() += static_cast<char>(data[i]);
    }
  }
  try {
    const auto o = lspawn::parse_cli(args);
    (void)o.program.size();
  } catch (const lspawn::UsageError&) {}
  return 0;
}
