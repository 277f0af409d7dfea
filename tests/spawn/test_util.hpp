// Helpers shared by the spawn tests: temp dirs, process liveness, files.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "supervisor/sys.hpp"

namespace spawn_test {

struct TempDir {
  std::string path = lspawn::sys::make_temp_dir("lspawn-spawn-test-");
  ~TempDir() { lspawn::sys::remove_tree(path); }
};

// Running (not a zombie): orphans may be reparented to a pid 1 that never reaps them.
inline bool alive(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "re");
  if (!f) return false;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string stat(buf, n);
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Waits until `pred` holds or `limit` passes; returns pred().
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  { std::ofstream(tmp) << text; }
  std::rename(tmp.c_str(), path.c_str());
}

inline bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace spawn_test
