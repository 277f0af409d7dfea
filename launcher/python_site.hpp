// The hang diagnosis of the Python workers lspawn executes (docs/hang-diagnosis.md, "Python
// workers"): a plain `lspawn python3 train.py` gets the same report as `--preload`, with no change
// to its command line.
//
// A worker whose argv[0] names a Python interpreter (basename python*), started without
// --preload, gets the folder of lspawn's sitecustomize.py (python/lspawn_site/, found beside the
// binary: supervisor/install_layout.hpp) first on its PYTHONPATH and LSPAWN_PYTHON_SITE=1.
// Python's `site` imports it at start-up; it takes itself off PYTHONPATH again (what the worker
// starts in turn runs as without lspawn), calls lspawn_hang.install() and imports the
// sitecustomize it shadows, if any (python/lspawn_site/sitecustomize.py).
//
// Off, and said once at start when --hang-timeout is on: LSPAWN_PYTHON_SITE=0 in lspawn's
// environment, an interpreter option that ignores PYTHONPATH or `site` (-E, -I, -S), or the file
// missing from the install.
#pragma once

#include <string>
#include <vector>

namespace lspawn::python_site {

inline constexpr const char* kEnv = "LSPAWN_PYTHON_SITE";

struct Decision {
  bool python = false;   // argv[0] names a Python interpreter
  std::string site_dir;  // the folder to put first on PYTHONPATH; "" when off
  std::string off_why;   // why it is off ("" when on, or not Python)
};

// `program`: the workers' argv; `env`: their environment ("NAME=value" entries).
Decision decide(const std::vector<std::string>& program, const std::vector<std::string>& env);

// Puts decision.site_dir first on env's PYTHONPATH and sets kEnv=1 (nothing when off).
void apply(const Decision& decision, std::vector<std::string>& env);

}  // namespace lspawn::python_site
