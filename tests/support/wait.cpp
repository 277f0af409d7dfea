#include "support/wait.hpp"

#include "support/files.hpp"

namespace lspawn::test {

bool wait_file(const std::string& path, std::chrono::milliseconds limit) {
  return eventually([&] { return path_exists(path); }, limit);
}

bool wait_files(const std::string& prefix, int n, std::chrono::milliseconds limit) {
  return eventually(
      [&] {
        for (int i = 0; i < n; ++i) {
          if (!path_exists(prefix + std::to_string(i))) return false;
        }
        return true;
      },
      limit);
}

}  // namespace lspawn::test
