#include "sys/epoll.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>

namespace lspawn::sys {

void raise_listen_backlog(int listen_fd, const std::string& context) {
  if (::listen(listen_fd, SOMAXCONN) != 0) throw_errno("listen(SOMAXCONN)", context);
}

Epoll::Epoll(std::string context) : context_(std::move(context)) {
  const int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) throw_errno("epoll_create1", context_);
  fd_ = Fd(fd);
}

void Epoll::add(int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (::epoll_ctl(fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl(EPOLL_CTL_ADD)", context_);
}

void Epoll::remove(int fd) {
  if (::epoll_ctl(fd_.get(), EPOLL_CTL_DEL, fd, nullptr) != 0 && errno != ENOENT && errno != EBADF) {
    throw_errno("epoll_ctl(EPOLL_CTL_DEL)", context_);
  }
}

std::vector<int> Epoll::ready(std::chrono::milliseconds timeout, int max) {
  std::vector<epoll_event> evs(static_cast<size_t>(std::max(max, 1)));
  const int ms = static_cast<int>(std::clamp<long long>(timeout.count(), 0, 24LL * 3600 * 1000));
  int n;
  do {
    n = ::epoll_wait(fd_.get(), evs.data(), static_cast<int>(evs.size()), ms);
  } while (n < 0 && errno == EINTR);
  if (n < 0) throw_errno("epoll_wait", context_);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out.push_back(evs[static_cast<size_t>(i)].data.fd);
  return out;
}

}  // namespace lspawn::sys
