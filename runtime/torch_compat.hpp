// The one place where lspawn meets the differences between the two LibTorch lines it builds
// against: Debian's LibTorch 1.13 and PyPI's LibTorch 2.x. Everything else in the tree is written
// once, against the functions here; no other file tests TORCH_VERSION_MAJOR.
//
// What differs (and is handled here):
//   - 1.13: ProcessGroupGloo / ProcessGroupNCCL *are* c10d::ProcessGroups.
//     2.x: they are c10d::Backends, and a c10d::ProcessGroup wraps one backend per device type.
//   - c10d::Reducer's constructor takes other arguments (DDP's engine, strategies/).
#pragma once

#include <torch/version.h>

#define LSPAWN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace lspawn::compat {

// Hands a bound, listening socket to a TCPStore server (TCPStoreOptions::masterListenFd, 2.x),
// so that it listens where lspawn chose (runtime/store_listener.hpp). Returns false where the
// option does not exist (1.13: the server binds its own socket; store_listener then steers that
// bind instead).
inline bool set_listen_fd(c10d::TCPStoreOptions& options, int fd) {
#if TORCH_VERSION_MAJOR >= 2
  options.masterListenFd = fd;
  return true;
#else
  (void)options;
  (void)fd;
  return false;
#endif
}

}  // namespace lspawn::compat

// Inside a c10d::Store subclass: declares clone() (pure virtual in 2.x, absent in 1.13) as
// returning `expr`.
#if TORCH_VERSION_MAJOR >= 2
#define LSPAWN_STORE_CLONE(expr) \
  c10::intrusive_ptr<c10d::Store> clone() override { return (expr); }
#else
#define LSPAWN_STORE_CLONE(expr)
#endif
