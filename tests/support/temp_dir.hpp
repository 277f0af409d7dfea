// TempDir: a fresh directory under $TMPDIR (else /tmp) for one test, removed with everything in
// it (std::filesystem::remove_all; links are removed, not followed) when the object goes.
// Tests only.
#pragma once

#include <string>

namespace lspawn::test {

struct TempDir {
  // Creates $TMPDIR/<prefix>XXXXXX (mkdtemp; an absolute path). Throws std::runtime_error.
  explicit TempDir(const std::string& prefix = "lspawn-test-");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // `path`/`name`.
  std::string file(const std::string& name) const { return path + "/" + name; }

  const std::string path;  // absolute, no trailing '/'
};

}  // namespace lspawn::test
