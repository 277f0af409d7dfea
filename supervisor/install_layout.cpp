#include "supervisor/install_layout.hpp"

#include <dirent.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <vector>

#include <stdlib.h>

#include "supervisor/version.hpp"

// Relative folders from the install tree's bin/ (set by CMake from GNUInstallDirs; relative, so
// nothing absolute is written into the binary).
#ifndef LSPAWN_REL_LIBEXEC
#define LSPAWN_REL_LIBEXEC "../libexec/lspawn"
#endif
#ifndef LSPAWN_REL_LIB
#define LSPAWN_REL_LIB "../lib/lspawn"
#endif
#ifndef LSPAWN_REL_PYTHON
#define LSPAWN_REL_PYTHON "../share/lspawn/python"
#endif

namespace lspawn::layout {
namespace {

bool exists(const std::string& path) { return !path.empty() && ::access(path.c_str(), F_OK) == 0; }

// `dir` joined with `rel`, each leading "../" of rel taken off dir instead ("/p/bin" + "../lib" ->
// "/p/lib"), so that the paths tried, and named in errors, read as they are on disk.
std::string join(std::string dir, std::string rel) {
  while (rel.rfind("../", 0) == 0) {
    const auto slash = dir.rfind('/');
    if (slash == std::string::npos || slash == 0) break;
    dir.erase(slash);
    rel.erase(0, 3);
  }
  return dir + "/" + rel;
}

// Each layout's folder of each helper, relative to its root (indexed by Helper).
struct Layout {
  const char* folder[4];
};
// A Python package folder (the wheel's site-packages/lspawn/, $LSPAWN_HOME).
constexpr Layout kPackage{{"libexec", "lib", ".", "lspawn_site"}};
// The `cmake --install` tree, from its bin/.
constexpr Layout kInstallTree{
    {LSPAWN_REL_LIBEXEC, LSPAWN_REL_LIB, LSPAWN_REL_PYTHON, LSPAWN_REL_PYTHON "/lspawn_site"}};
// A build tree, from its top.
constexpr Layout kBuildTree{{"supervisor", "spawn", "python", "python/lspawn_site"}};

std::string in(const Layout& layout, const std::string& root, Helper h) {
  const std::string folder = layout.folder[static_cast<int>(h)];
  return join(root, (folder == "." ? std::string() : folder + "/") + file_name(h));
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The package's version (its _version.py: __version__ = "X.Y.Z"), "" when unreadable.
std::string package_version(const std::string& pkg) {
  std::ifstream in(pkg + "/_version.py");
  std::string line;
  while (std::getline(in, line)) {
    const auto q1 = line.find('"');
    const auto q2 = q1 == std::string::npos ? q1 : line.find('"', q1 + 1);
    if (line.rfind("__version__", 0) == 0 && q2 != std::string::npos) return line.substr(q1 + 1, q2 - q1 - 1);
  }
  return "";
}

// <bin>/../lib{,64}/python3.*/{site,dist}-packages/lspawn that hold the helper; the one of this
// program's version first.
std::vector<std::string> wheel_packages(const std::string& bin) {
  std::vector<std::string> found, same_version;
  std::vector<std::string> seen;  // real paths: a venv's lib64 is a link to lib
  for (const char* lib : {"../lib", "../lib64"}) {
    const std::string libdir = join(bin, lib);
    char real[PATH_MAX];
    if (!::realpath(libdir.c_str(), real)) continue;
    if (std::find(seen.begin(), seen.end(), real) != seen.end()) continue;
    seen.emplace_back(real);
    for (const std::string& py : list_dir(libdir)) {
      if (py.rfind("python3", 0) != 0) continue;
      for (const char* sp : {"/site-packages/lspawn", "/dist-packages/lspawn"}) {
        const std::string pkg = libdir + "/" + py + sp;
        if (!exists(pkg + "/__init__.py")) continue;
        (package_version(pkg) == kVersion ? same_version : found).push_back(pkg);
      }
    }
  }
  same_version.insert(same_version.end(), found.begin(), found.end());
  return same_version;
}

}  // namespace

const char* file_name(Helper h) {
  switch (h) {
    case Helper::Guardian: return "lspawn-guardian";
    case Helper::PreloadLibrary: return "liblspawn_preload.so";
    case Helper::PreloadBootstrap: return "lspawn_preload.py";
    case Helper::PythonSite: return "sitecustomize.py";
  }
  return "";
}

std::string program_path() {
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
}

std::string program_dir() {
  const std::string path = program_path();
  if (path.empty()) return "";
  const auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

std::string find(Helper h, std::string* looked) {
  std::string tried;
  auto check = [&](const std::string& path) {
    tried += (tried.empty() ? "" : "; ") + path;
    return exists(path);
  };
  auto done = [&](std::string path) {
    if (looked) *looked = tried;
    return path;
  };
  if (const char* home = std::getenv("LSPAWN_HOME"); home && *home) {
    const std::string p = in(kPackage, home, h);
    return done(check(p) ? p : "");
  }
  const std::string bin = program_dir();
  if (bin.empty()) return done("");
  if (std::string p = in(kInstallTree, bin, h); check(p)) return done(p);
  for (const std::string& pkg : wheel_packages(bin)) {
    if (std::string p = in(kPackage, pkg, h); check(p)) return done(p);
  }
  std::string dir = bin;
  for (int up = 0; up < 3 && !dir.empty(); ++up) {
    if (exists(dir + "/CMakeCache.txt")) {
      const std::string p = in(kBuildTree, dir, h);
      return done(check(p) ? p : "");
    }
    const auto slash = dir.rfind('/');
    dir = slash == std::string::npos || slash == 0 ? "" : dir.substr(0, slash);
  }
  return done("");
}

}  // namespace lspawn::layout
