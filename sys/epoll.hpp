// What a server of thousands of peers needs beyond sys.hpp (the coordinator of a job's nodes,
// cluster/node_group.hpp; bench/scale measured it at 4,096 nodes):
//
// sys::Epoll: one epoll instance over many fds, for a loop that watches thousands of them where
// poll() would cost O(fds) per wake-up.
// Input only (EPOLLIN), level-triggered: a ready fd is reported again until it is read dry.
// The instance's own fd is readable while any watched fd is, so an outer poll() loop (the
// supervisor's) watches the whole set as one fd.
//
// An fd closed while watched leaves the set by itself (the kernel's rule, when no duplicate of it
// is open); remove() before close is still the rule here, so a reused fd number is never mistaken
// for the old one. Wrapped as sys.hpp wraps its calls: EINTR retried, failures throw SysError
// with the caller's context, the fd O_CLOEXEC.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "sys/sys.hpp"

namespace lspawn::sys {

// listen() again on a listening socket (sys::tcp_listen's backlog is 128) with SOMAXCONN, i.e.
// the kernel's own cap, net.core.somaxconn (4096 since Linux 5.4): a thousand peers that connect
// at once all wait in the backlog. With 128, the rest's SYNs are dropped and each of them waits
// out TCP's 1 s retransmission, then 3 s. Throws SysError.
void raise_listen_backlog(int listen_fd, const std::string& context);

class Epoll {
 public:
  explicit Epoll(std::string context);  // throws SysError
  int fd() const { return fd_.get(); }
  // Watches `fd` for input. Throws SysError (EEXIST: it is watched already).
  void add(int fd);
  // Stops watching `fd`; not watched (or closed already): nothing.
  void remove(int fd);
  // The fds that are readable (or hung up, or in error), waiting up to `timeout` for one
  // (0: not at all); at most `max` of them.
  std::vector<int> ready(std::chrono::milliseconds timeout, int max = 1024);

 private:
  Fd fd_;
  std::string context_;
};

}  // namespace lspawn::sys
