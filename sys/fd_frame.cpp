#include "sys/fd_frame.hpp"

#include "proto/messages.hpp"
#include "proto/wire.hpp"

namespace lspawn::fd_frame {
namespace {

// Reads exactly n bytes; false on EOF before the first byte; throws on a truncated read.
bool read_exact(int fd, char* p, size_t n, const std::string& context) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = sys::read_some(fd, p + got, n - got, context);
    if (r == 0) {
      if (got == 0) return false;
      throw wire::WireError(context + ": truncated frame");
    }
    if (r < 0) throw wire::WireError(context + ": the socket is non-blocking");
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

template <class Msg>
void write(int sock, const Msg& msg, const int* fds, size_t nfds, const std::string& context) {
  sys::send_with_fds(sock, wire::encode_frame(msg), fds, nfds, context);
}

template <class Msg>
bool read(int sock, Msg& msg, sys::Fd* fds, size_t max_fds, uint32_t max_bytes, const std::string& context) {
  char hdr[4];
  const ssize_t r = sys::recv_with_fds(sock, hdr, sizeof hdr, fds, max_fds, context);
  if (r < 0) throw wire::WireError(context + ": the socket is non-blocking");
  if (r == 0) return false;
  if (r < 4 && !read_exact(sock, hdr + r, 4 - static_cast<size_t>(r), context)) {
    throw wire::WireError(context + ": truncated frame header");
  }
  const uint32_t len = uint32_t(uint8_t(hdr[0])) | uint32_t(uint8_t(hdr[1])) << 8 | uint32_t(uint8_t(hdr[2])) << 16 |
                       uint32_t(uint8_t(hdr[3])) << 24;
  if (len > max_bytes) {
    throw wire::WireError(context + ": frame of " + std::to_string(len) + " bytes exceeds the bound of " +
                          std::to_string(max_bytes));
  }
  std::string frame(hdr, 4);
  frame.resize(4 + size_t(len));
  if (len > 0 && !read_exact(sock, frame.data() + 4, len, context)) {
    throw wire::WireError(context + ": truncated frame");
  }
  if (!wire::try_decode_frame(frame, msg, context.c_str(), max_bytes)) {
    throw wire::WireError(context + ": incomplete frame");
  }
  return true;
}

template void write<proto::ForkRequest>(int, const proto::ForkRequest&, const int*, size_t, const std::string&);
template bool read<proto::ForkRequest>(int, proto::ForkRequest&, sys::Fd*, size_t, uint32_t, const std::string&);
template void write<proto::DaemonReply>(int, const proto::DaemonReply&, const int*, size_t, const std::string&);
template bool read<proto::DaemonReply>(int, proto::DaemonReply&, sys::Fd*, size_t, uint32_t, const std::string&);

}  // namespace lspawn::fd_frame
