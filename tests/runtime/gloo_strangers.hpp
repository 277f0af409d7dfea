// Strangers on gloo's listeners (tests only): both sides of test_worker's gloo-strangers mode,
// used by the worker, the secured-rendezvous test and the fault matrix. The worker writes
// $LSPAWN_TEST_SYNC_DIR/ready-<rank> (write_ready) before it makes its second gloo group, and
// waits for go-1 / go-2 there (test_worker.cpp).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/runtime/sockets.hpp"
#include "support/files.hpp"
#include "support/loopback.hpp"
#include "support/wait.hpp"

namespace lspawn::test {

// The worker's side: `path` gets this process's pid, then the ports it listens on, one per line
// (written aside and renamed, so that a reader never sees half of it).
inline void write_ready(const std::string& path) {
  std::string text = std::to_string(::getpid()) + "\n";
  for (const auto& l : tcp_listeners(::getpid())) text += std::to_string(l.port) + "\n";
  write_file(path, text);
}

// The test's side: the ranks of a gloo-strangers job once each has written dir/ready-<rank>;
// their pids, and every port they listened on before the second group (the store's and the
// world's gloo ports). Empty pids when some rank did not write it within `limit`.
struct ReadyRanks {
  std::vector<pid_t> pids;
  std::set<uint16_t> known;
};

inline ReadyRanks wait_ready(const std::string& dir, int n, std::chrono::milliseconds limit) {
  ReadyRanks out;
  for (int r = 0; r < n; ++r) {
    const std::string path = dir + "/ready-" + std::to_string(r);
    if (!wait_file(path, limit)) return {};
    std::ifstream in(path);
    long pid = 0;
    in >> pid;
    out.pids.push_back(static_cast<pid_t>(pid));
    for (unsigned port; in >> port;) out.known.insert(static_cast<uint16_t>(port));
  }
  return out;
}

// The ports `pid` listens on that are not in `known`.
inline std::set<uint16_t> new_ports(pid_t pid, const std::set<uint16_t>& known) {
  std::set<uint16_t> out;
  for (const auto& l : tcp_listeners(pid)) {
    if (!known.count(l.port)) out.insert(l.port);
  }
  return out;
}

// The second group's listeners: waits (at most `limit`) until the first two of `pids` listen on
// a port not in `known`, then returns the new ports of all of them.
inline std::set<uint16_t> late_listeners(const std::vector<pid_t>& pids, const std::set<uint16_t>& known,
                                         std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!new_ports(pids[0], known).empty() && !new_ports(pids[1], known).empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // each rank opens all of its
      std::set<uint16_t> late;
      for (pid_t p : pids) {
        const auto more = new_ports(p, known);
        late.insert(more.begin(), more.end());
      }
      return late;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return {};
}

// Strangers on one gloo listener, at once: random bytes; gloo's own opening (an 8-byte sequence
// number, 0); `extra` when not empty (a forged token, say); a reset; and, when `silent`, a
// connection that sends nothing. Returns the descriptors left open (the caller closes them).
inline std::vector<int> strangers(uint16_t port, std::mt19937& rng, bool silent,
                                  const std::vector<unsigned char>& extra = {}) {
  std::vector<int> open;
  std::vector<unsigned char> junk(4096);
  for (auto& b : junk) b = static_cast<unsigned char>(rng() | 0x80);  // never "LSG1"
  std::vector<unsigned char> seq0(8, 0);
  const std::vector<unsigned char>* attacks[] = {&junk, &seq0, &extra};
  for (const std::vector<unsigned char>* bytes : attacks) {
    if (bytes->empty()) continue;
    if (int fd = connect_to(port); fd >= 0) {
      (void)!::send(fd, bytes->data(), bytes->size(), MSG_NOSIGNAL);
      open.push_back(fd);
    }
  }
  if (int fd = connect_to(port); fd >= 0) {
    linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd);
  }
  if (silent) {
    if (int fd = connect_to(port); fd >= 0) open.push_back(fd);
  }
  return open;
}

}  // namespace lspawn::test
