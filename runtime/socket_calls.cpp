#include "runtime/socket_calls.hpp"

#include <cerrno>

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lspawn::detail {

bool socket_calls_interposed() {
  return ::dlsym(RTLD_DEFAULT, "bind") == reinterpret_cast<void*>(&::bind) &&
         ::dlsym(RTLD_DEFAULT, "accept") == reinterpret_cast<void*>(&::accept) &&
         ::dlsym(RTLD_DEFAULT, "accept4") == reinterpret_cast<void*>(&::accept4) &&
         ::dlsym(RTLD_DEFAULT, "connect") == reinterpret_cast<void*>(&::connect);
}

}  // namespace lspawn::detail

extern "C" int bind(int fd, const struct sockaddr* addr, socklen_t len) noexcept {
  const int rc = lspawn::detail::steered_bind(fd, addr, len);
  if (rc == 0) lspawn::detail::gloo_guard_note_bind(fd);
  return rc;
}

extern "C" int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  return lspawn::detail::gloo_guard_accept(fd, addr, len, 0);
}

extern "C" int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  return lspawn::detail::gloo_guard_accept(fd, addr, len, flags);
}

extern "C" int connect(int fd, const struct sockaddr* addr, socklen_t len) {
  const int rc = static_cast<int>(::syscall(SYS_connect, fd, addr, len));
  const int saved = errno;
  lspawn::detail::gloo_guard_after_connect(fd, addr, len, rc);
  errno = saved;
  return rc;
}
