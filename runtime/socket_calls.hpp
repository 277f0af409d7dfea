// The process's bind(), accept(), accept4() and connect(): lspawn_runtime defines them
// (socket_calls.cpp). Each forwards to the system call and lets two parts of the runtime act on
// the sockets they own:
//   - bind(): BindSteering (store_listener.hpp) steers a wildcard bind of the 1.13 TCPStore to
//     the chosen address; GlooGuard (gloo_guard.hpp) notes gloo's listeners.
//   - accept(), accept4(), connect(): GlooGuard checks and sends the connection tokens of gloo's
//     connections.
// They take effect when the runtime is linked into the executable with these symbols exported
// (every lspawn program: ENABLE_EXPORTS, or because LibTorch's libraries reference them): gloo
// and TCPStore, in shared libraries, then call them instead of libc's. All four live in one
// object, which both users pull in (through socket_calls_interposed()), so that a link never
// takes some of them and not the others.
#pragma once

#include <sys/socket.h>

namespace lspawn::detail {

// Whether the process's bind(), accept(), accept4() and connect() are the ones defined here
// (what symbol lookup finds, so what LibTorch and gloo call).
bool socket_calls_interposed();

// The hooks, defined by their owners.
int steered_bind(int fd, const sockaddr* addr, socklen_t len);                                // store_listener.cpp
void gloo_guard_note_bind(int fd) noexcept;                                                   // gloo_guard.cpp
int gloo_guard_accept(int fd, sockaddr* addr, socklen_t* len, int flags);                     // gloo_guard.cpp
void gloo_guard_after_connect(int fd, const sockaddr* addr, socklen_t len, int rc) noexcept;  // gloo_guard.cpp

}  // namespace lspawn::detail
