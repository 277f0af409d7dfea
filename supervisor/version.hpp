// lspawn's version string, printed by `lspawn --version` and exported as LSPAWN_VERSION.
// Defined in one place only: CMakeLists.txt's project(VERSION), written into the generated
// version.cpp (supervisor/version.cpp.in); the Python package reads the same line
// (pyproject.toml: scikit-build-core's regex provider).
#pragma once

namespace lspawn {
extern const char* const kVersion;
}  // namespace lspawn
