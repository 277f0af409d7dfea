// The TCP sockets a process listens on, from /proc (tests only): to check where a worker's
// store and gloo listen, and to send garbage to them.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace lspawn::test {

struct Listener {
  std::string addr;  // numeric; IPv4-mapped IPv6 addresses as their IPv4 form
  uint16_t port = 0;
};

// Every TCP socket of process `pid` in state LISTEN.
inline std::vector<Listener> tcp_listeners(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  if (DIR* d = ::opendir((base + "/fd").c_str())) {
    while (dirent* e = ::readdir(d)) {
      char link[128] = {};
      const std::string p = base + "/fd/" + e->d_name;
      const ssize_t n = ::readlink(p.c_str(), link, sizeof link - 1);
      if (n > 9 && std::strncmp(link, "socket:[", 8) == 0) inodes.insert(std::string(link + 8, link + n - 1));
    }
    ::closedir(d);
  }
  std::vector<Listener> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(base + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ls >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st != "0A" || !inodes.count(inode)) continue;
      const auto colon = local.find(':');
      Listener l;
      l.port = static_cast<uint16_t>(std::strtoul(local.c_str() + colon + 1, nullptr, 16));
      const std::string hex = local.substr(0, colon);
      char buf[INET6_ADDRSTRLEN] = {};
      if (hex.size() == 8) {
        in_addr a;
        a.s_addr = static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16));
        ::inet_ntop(AF_INET, &a, buf, sizeof buf);
      } else {
        in6_addr a;
        for (int w = 0; w < 4; ++w) {
          const uint32_t v = static_cast<uint32_t>(std::strtoul(hex.substr(8 * w, 8).c_str(), nullptr, 16));
          std::memcpy(reinterpret_cast<char*>(&a) + 4 * w, &v, 4);
        }
        if (IN6_IS_ADDR_V4MAPPED(&a)) {
          ::inet_ntop(AF_INET, reinterpret_cast<char*>(&a) + 12, buf, sizeof buf);
        } else {
          ::inet_ntop(AF_INET6, &a, buf, sizeof buf);
        }
      }
      l.addr = buf;
      out.push_back(l);
    }
  }
  return out;
}

}  // namespace lspawn::test
