// Frames from a peer (forkserver, spawn() child, launcher, warm daemon and its clients): wire::try_decode_frame must reject
// every malformed, oversize or newer-version frame with WireError, never crash or over-allocate.
#include <cstddef>
#include <cstdint>
#include <string>

#include "proto/messages.hpp"
#include "proto/wire.hpp"

namespace {
template <class Msg>
void decode_all(std::string buf) {
  for (int i = 0; i < 64; ++i) {
    Msg msg;
    try {
      if (!lspawn::wire::try_decode_frame(buf, msg, "fuzz", 1u << 16)) return;
    } catch (const lspawn::wire::WireError&) {
      return;
    }
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte chooses the message type, the rest is the byte stream.
  const std::string buf(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0: decode_all<lspawn::proto::ForkRequest>(buf); break;
    case 5: decode_all<lspawn::proto::DaemonRequest>(buf); break;  // the warm daemon's socket
    case 6: decode_all<lspawn::proto::DaemonReply>(buf); break;
    case 1: decode_all<lspawn::proto::ForkReply>(buf); break;
    case 2: decode_all<lspawn::proto::ChildExit>(buf); break;
    case 3: decode_all<lspawn::proto::SpawnCall>(buf); break;
    default: decode_all<lspawn::proto::SpawnResult>(buf); break;
  }
  return 0;
}
