// Frames (proto/wire.hpp) that carry file descriptors: SCM_RIGHTS on a unix stream socket, sent
// with the frame's first bytes. The forkserver protocol (a worker's stdout/stderr, a per-run
// server's socket and exit pipe) and the warm daemon's replies (docs/warm-start.md) use them.
//
// `Msg` is proto::ForkRequest or proto::DaemonReply (instantiated in fd_frame.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sys/sys.hpp"

namespace lspawn::fd_frame {

// Writes one frame of `msg` with fds[0..nfds) attached. Throws SysError (EPIPE: peer gone).
template <class Msg>
void write(int sock, const Msg& msg, const int* fds, size_t nfds, const std::string& context);

// Reads one frame (blocking) into `msg`; the fds that came with it go to fds[0..max_fds).
// Returns false on EOF before the frame's first byte. Throws wire::WireError on a truncated,
// oversize (> max_bytes) or malformed frame, SysError on a socket error.
template <class Msg>
bool read(int sock, Msg& msg, sys::Fd* fds, size_t max_fds, uint32_t max_bytes, const std::string& context);

}  // namespace lspawn::fd_frame
