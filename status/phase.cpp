#include "status/phase.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <unistd.h>

namespace lspawn::status {
namespace {

std::string marker_path(const std::string& dir, int rank, const char* phase) {
  return dir + "/rank-" + std::to_string(rank) + "." + phase;
}

// The pid a marker holds, 0 when it is missing or unreadable.
int marker_pid(const std::string& path) {
  std::ifstream in(path);
  int pid = 0;
  return in >> pid ? pid : 0;
}

}  // namespace

void mark_phase(const char* phase) {
  const char* dir = std::getenv("LSPAWN_STATUS_DIR");
  const char* rank_text = std::getenv("RANK");
  if (!dir || !*dir || !rank_text || !*rank_text) return;
  char* end = nullptr;
  const long rank = std::strtol(rank_text, &end, 10);
  if (*end != '\0' || rank < 0) return;
  const std::string path = marker_path(dir, static_cast<int>(rank), phase);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (FILE* f = std::fopen(tmp.c_str(), "we")) {
    const bool ok = std::fprintf(f, "%d\n", static_cast<int>(::getpid())) > 0;
    if (std::fclose(f) == 0 && ok && std::rename(tmp.c_str(), path.c_str()) == 0) return;
    std::remove(tmp.c_str());
  }
}

StartPhase start_phase(const std::string& dir, int rank, int pid) {
  if (pid > 0 && marker_pid(marker_path(dir, rank, "rendezvous")) == pid) return StartPhase::Rendezvous;
  if (pid > 0 && marker_pid(marker_path(dir, rank, "started")) == pid) return StartPhase::BeforeRendezvous;
  return StartPhase::Unknown;
}

}  // namespace lspawn::status
