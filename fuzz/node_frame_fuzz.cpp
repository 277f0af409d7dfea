// Frames from a peer on the control channel of a multi-node job (proto/node_wire.hpp): anything
// that reaches the rendezvous port. wire::decode_node_frame and decode_node_body must reject every
// malformed, oversize or out-of-range input with WireError, never crash or over-allocate; and a
// body that decodes must encode to bytes that decode to the same (AssignEncoder's included).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "proto/node_messages.hpp"
#include "proto/node_wire.hpp"

namespace {

using namespace lspawn;

// Decodes `body` as Msg; when it is one, its encoding must be stable under another round trip.
template <class Msg>
void body_as(const std::string& body) {
  Msg msg;
  try {
    wire::decode_node_body(body, msg);
  } catch (const wire::WireError&) {
    return;
  }
  const std::string once = wire::encode_node_body(msg);
  Msg again;
  wire::decode_node_body(once, again);  // throws (and the fuzzer reports it) if it cannot
  if (wire::encode_node_body(again) != once) std::abort();
  if constexpr (std::is_same_v<Msg, proto::AssignMsg>) {
    proto::AssignMsg shared;
    wire::decode_node_body(wire::AssignEncoder(msg).for_node(msg.node_rank), shared);
    if (wire::encode_node_body(shared) != once) std::abort();
  }
}

void every_body(const std::string& body) {
  body_as<proto::JoinMsg>(body);
  body_as<proto::JoinedMsg>(body);
  body_as<proto::AssignMsg>(body);
  body_as<proto::RejectMsg>(body);
  body_as<proto::FailedMsg>(body);
  body_as<proto::StopMsg>(body);
  body_as<proto::DoneMsg>(body);
  body_as<proto::BusyMsg>(body);
  body_as<proto::StartMsg>(body);
  body_as<proto::FinishMsg>(body);
  body_as<proto::Heartbeat>(body);
  body_as<proto::StatusMsg>(body);
  body_as<proto::StackAskMsg>(body);
  body_as<proto::StacksMsg>(body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The byte stream of a link: frames one after another, as Link::read takes them.
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  for (int i = 0; i < 64; ++i) {
    wire::NodeFrame frame;
    size_t used = 0;
    try {
      used = wire::decode_node_frame(p, left, frame, 1u << 16);
    } catch (const wire::WireError&) {
      break;
    }
    if (used == 0) break;
    // The frame re-encoded is a frame of the same type and body.
    const std::string again = wire::encode_node_frame(frame.type, frame.body, 1u << 17);
    wire::NodeFrame back;
    if (wire::decode_node_frame(again.data(), again.size(), back, 1u << 17) != again.size() ||
        back.type != frame.type || back.body != frame.body) {
      std::abort();
    }
    every_body(frame.body);
    p += used;
    left -= used;
  }
  // The whole input as a body too (no frame around it).
  every_body(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
