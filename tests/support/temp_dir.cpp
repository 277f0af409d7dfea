#include "support/temp_dir.hpp"

#include <filesystem>
#include <system_error>

#include "sys/sys.hpp"

namespace lspawn::test {

TempDir::TempDir(const std::string& prefix) : path(sys::make_temp_dir(prefix)) {}

TempDir::~TempDir() {
  std::error_code ignored;  // a destructor: what cannot be removed stays
  std::filesystem::remove_all(path, ignored);
}

}  // namespace lspawn::test
