#include "status/phase.hpp"
#include "status/reader.hpp"

#include <cstdio>
#include <fstream>

#include <unistd.h>

namespace lspawn::status {
namespace {

// The pid a marker holds, 0 when it is missing or unreadable.
int marker_pid(const std::string& path) {
  std::ifstream in(path);
  int pid = 0;
  return in >> pid ? pid : 0;
}

}  // namespace

void mark_phase(const char* phase) {
  const auto place = rank_place_from_environment();
  if (!place) return;
  const std::string path = rank_file(place->dir, place->rank, phase);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (FILE* f = std::fopen(tmp.c_str(), "we")) {
    const bool ok = std::fprintf(f, "%d\n", static_cast<int>(::getpid())) > 0;
    if (std::fclose(f) == 0 && ok && std::rename(tmp.c_str(), path.c_str()) == 0) return;
    std::remove(tmp.c_str());
  }
}

StartPhase start_phase(const std::string& dir, int rank, int pid) {
  if (pid > 0 && marker_pid(rank_file(dir, rank, "rendezvous")) == pid) return StartPhase::Rendezvous;
  if (pid > 0 && marker_pid(rank_file(dir, rank, "started")) == pid) return StartPhase::BeforeRendezvous;
  return StartPhase::Unknown;
}

}  // namespace lspawn::status
