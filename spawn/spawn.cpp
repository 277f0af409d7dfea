#include "spawn/spawn.hpp"

#include <dirent.h>

#include <cctype>
#include <cstdlib>
#include <string>

namespace lspawn {

const char* start_method_name(StartMethod m) {
  switch (m) {
    case StartMethod::Fork: return "fork";
    case StartMethod::Spawn: return "spawn";
    case StartMethod::Forkserver: return "forkserver";
  }
  return "unknown";
}

int local_accelerator_count() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    // "0,1,3" -> 3; "" or "-1..." -> 0 (CUDA stops at the first invalid entry).
    int n = 0;
    std::string s(visible);
    size_t pos = 0;
    while (pos <= s.size()) {
      const size_t comma = s.find(',', pos);
      const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (item.empty() || item[0] == '-') break;
      ++n;
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    return n;
  }
  int n = 0;
  if (DIR* d = ::opendir("/dev")) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 && std::isdigit(static_cast<unsigned char>(name[6]))) {
        bool digits = true;
        for (size_t i = 6; i < name.size(); ++i) digits = digits && std::isdigit(static_cast<unsigned char>(name[i]));
        n += digits;
      }
    }
    ::closedir(d);
  }
  return n;
}

namespace spawn_detail {
int resolve_nprocs(const SpawnOptions& opts) {
  if (!opts.nprocs) {
    const int n = local_accelerator_count();
    return n > 0 ? n : 1;
  }
  const int n = *opts.nprocs;
  if (n < 1 || n > SpawnOptions::kMaxProcs) {
    throw SpawnError("spawn(): nprocs=" + std::to_string(n) + " is invalid; it must be between 1 and " +
                     std::to_string(SpawnOptions::kMaxProcs) +
                     " (leave it unset for one process per local accelerator)");
  }
  return n;
}
}  // namespace spawn_detail

}  // namespace lspawn
