// Reading an ELF executable's section names: how lspawn tells, before it starts anything,
// whether a program can be its forkserver (it carries the hook's section).
#pragma once

#include <string>

namespace lspawn::elf {

// Whether the 64-bit little-endian ELF file at `path` has a section named `name`. False for
// a file that is not such an ELF file (a script, a 32-bit binary). Throws sys::SysError naming
// the path when it cannot be opened or read.
bool has_section(const std::string& path, const std::string& name);

}  // namespace lspawn::elf
