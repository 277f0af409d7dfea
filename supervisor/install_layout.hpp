// Where lspawn's helper files are — the guardian program, and --preload's Python server and its
// library — found from where the running program is (/proc/self/exe), never from a path written
// into it at build time: a `cmake --install` tree, a wheel installed into any venv (or moved
// with it) and the build tree each work where they are (docs/python.md, "Layouts").
//
// Looked for, in order (the first place where the file exists wins):
//   1. $LSPAWN_HOME, when set: a Python package's folder (the wheel's site-packages/lspawn/,
//      set by `python -m lspawn` and lspawn.spawn()): libexec/lspawn-guardian,
//      lib/liblspawn_preload.so, lspawn_preload.py, lspawn_site/sitecustomize.py (PythonSite: the
//      Python workers' hang diagnosis, launcher/python_site.hpp; lspawn_hang.py is beside
//      lspawn_preload.py in every layout). When it is set, nothing else is looked at:
//      a damaged package is named, not silently replaced by another install.
//   2. the install tree of the program: <bin>/../libexec/lspawn/lspawn-guardian,
//      <bin>/../lib/lspawn/liblspawn_preload.so, <bin>/../share/lspawn/python/lspawn_preload.py
//      (and .../python/lspawn_site/sitecustomize.py)
//      (GNUInstallDirs' relative folders, as `cmake --install` laid them out);
//   3. a wheel's package beside the program: <bin>/../lib{,64}/python3.*/{site,dist}-packages/lspawn/
//      (pip puts the `lspawn` binary in <prefix>/bin and the package in the prefix's
//      site-packages; with several Pythons in one prefix, the package of lspawn's own version);
//   4. the build tree the program is in: the nearest of <bin>, its parent and grandparent that
//      holds a CMakeCache.txt: supervisor/lspawn-guardian, spawn/liblspawn_preload.so,
//      python/lspawn_preload.py (copied there by the build).
#pragma once

#include <string>

namespace lspawn::layout {

// The values index install_layout.cpp's layout tables: append only.
enum class Helper { Guardian, PreloadLibrary, PreloadBootstrap, PythonSite };

// The helper's file name, e.g. "lspawn-guardian".
const char* file_name(Helper h);

// The helper's path ("" when it is nowhere); `looked`, when given, is set to every path tried,
// "; "-separated, for an error that says where it looked.
std::string find(Helper h, std::string* looked = nullptr);

// The running program (/proc/self/exe), "" when it cannot be read.
std::string program_path();

// The folder of the running program (/proc/self/exe's), "" when it cannot be read.
std::string program_dir();

}  // namespace lspawn::layout
