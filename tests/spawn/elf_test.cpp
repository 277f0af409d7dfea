#include <catch2/catch.hpp>

#include <fstream>

#include "spawn/elf.hpp"
#include "support/temp_dir.hpp"

using lspawn::elf::has_section;

TEST_CASE("elf::has_section finds a section by name in an ELF64 file", "[elf]") {
  CHECK(has_section("/proc/self/exe", ".text"));
  CHECK_FALSE(has_section("/proc/self/exe", ".note.lspawn.forkserver"));  // tests do not link the hook
  CHECK_FALSE(has_section("/proc/self/exe", ".tex"));
}

TEST_CASE("elf::has_section is false for files that are not ELF64 - and names an unreadable path", "[elf]") {
  const lspawn::test::TempDir tmp;
  const std::string dir = tmp.path;
  const std::string script = dir + "/script.sh", tiny = dir + "/tiny", fake = dir + "/fake";
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  std::ofstream(tiny) << "\x7f"
                         "EL";
  std::ofstream(fake) << std::string(
                             "\x7f"
                             "ELF\x02\x01\x01",
                             7)
                      << std::string(200, '\xff');
  CHECK_FALSE(has_section(script, ".text"));
  CHECK_FALSE(has_section(tiny, ".text"));
  CHECK_FALSE(has_section(fake, ".text"));  // header claims sections far past the end
  CHECK_THROWS_WITH(has_section(dir + "/missing", ".text"), Catch::Contains(dir + "/missing"));
}
