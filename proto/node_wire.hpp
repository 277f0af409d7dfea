// The control channel's frames and bodies (the messages of proto/node_messages.hpp), in memory:
// cluster/node_channel.hpp reads and writes them on its TCP links.
//
// Frame: 4-byte big-endian length (network order, as this channel always had: an lspawn of any
// protocol version reads another's join far enough to refuse it by its version), then a CBOR map
// {"t": type, "m": body}, the type a text ("join", "hb", ...) and the body the CBOR map of one
// message, its fields by name (proto/schema.hpp), written and read by proto's codec (wire.cpp), as
// the frames of proto/wire.hpp are. A length above the reader's bound (kMaxNodeFrame) is refused
// before anything is allocated; nesting deeper than kMaxNesting is refused while parsing.
//
// Errors are WireError, whose text names what was wrong and never repeats the bytes:
//   frames  "length 1048577 exceeds 1048576", "frame of 3 bytes: <parser's reason>",
//           "frame of 9 bytes: no message type (a text at \"t\")"
//   bodies  "malformed AssignMsg (17 bytes): AssignMsg.node_rank: expected an integer, got string"
// cluster/node_channel.hpp turns the first into LinkError ("bad frame: ...") and the second into
// BadMessage ("body of 'assign': ...").
//
// Thread-safety: none needed; every function is pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "proto/node_messages.hpp"
#include "proto/wire.hpp"

namespace lspawn::wire {

// The bound of one frame of the control channel: a root-cause report with a backtrace, an
// assignment naming thousands of hosts.
inline constexpr uint32_t kMaxNodeFrame = 1u << 20;

// `Msg` below: one of the bodies of node_messages.hpp, proto::JoinMsg ... proto::StacksMsg and
// proto::Heartbeat (instantiated for those in wire.cpp).

// The body of `msg`: a CBOR map from field name to value.
template <class Msg>
std::string encode_node_body(const Msg& msg);

// Reads `cbor` as Msg: a missing field keeps its default, an unknown one is ignored. Throws
// WireError naming the message and the field; msg is then left at its defaults.
template <class Msg>
void decode_node_body(const std::string& cbor, Msg& msg);

// The frame of `type` with `body` (the bytes of encode_node_body; empty: no fields), length
// included. Throws WireError when it would exceed max_bytes.
std::string encode_node_frame(const std::string& type, const std::string& body, uint32_t max_bytes = kMaxNodeFrame);

// One frame read: its type and its body's CBOR (decode_node_body reads it).
struct NodeFrame {
  std::string type;
  std::string body;
};

// Reads the frame at the start of data[0, n): returns the bytes it takes (length included), or 0
// when data holds less than a whole frame (nothing is allocated for the rest). Throws WireError
// for a length above max_bytes (as soon as the 4 bytes of length are there), bytes that are not
// CBOR, or a map without a text "t" and an "m".
size_t decode_node_frame(const char* data, size_t n, NodeFrame& frame, uint32_t max_bytes = kMaxNodeFrame);

// The assignments of many nodes, which differ in node_rank alone: the other fields (the hosts of
// every node among them) are encoded once, so assigning K nodes costs O(K) bytes of encoding per
// node's share and not an encoding of all K hosts per node (O(K^2): seconds at 4,096 nodes).
// for_node(r) decodes as encode_node_body(AssignMsg) with node_rank r.
class AssignEncoder {
 public:
  explicit AssignEncoder(const proto::AssignMsg& common);
  std::string for_node(int node_rank) const;

 private:
  std::string shared_;  // the CBOR of every field but node_rank, without the map's header
  size_t fields_ = 0;   // how many
};

}  // namespace lspawn::wire
