// lspawn's version string, printed by `lspawn --version` and exported as LSPAWN_VERSION.
#pragma once

namespace lspawn {
inline constexpr const char* kVersion = "0.2.0";
}  // namespace lspawn
