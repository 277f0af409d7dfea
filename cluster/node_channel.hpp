// The control channel between the lspawn processes of a multi-node job (docs/multi-node.md).
//
// `launcher/` never links LibTorch, so the launchers do not use c10d's store: one lspawn (the
// coordinator, node 0 in static mode) listens on the rendezvous endpoint, every other one
// connects to it, and they exchange the small messages below over that TCP connection.
//
// Wire format: the channel speaks proto's node messages (proto/node_messages.hpp), framed and
// encoded by proto (proto/node_wire.hpp): each message is a frame = 4-byte big-endian length + a
// CBOR map {"t": type, "m": body}, the body the CBOR map of one message, from field name to value
// (unknown fields ignored, missing ones take their defaults). A length above kMaxFrame closes the
// link before anything is allocated; a frame that is not valid CBOR, or lacks "t" or "m", also
// closes it (Link::read throws LinkError "bad frame: ..."); a body of the wrong shape is a
// BadMessage when it is read (Message::as). The version of the channel is kProtocolVersion, sent in
// the join; the coordinator refuses a node of another version, naming both (node_group.hpp).
//
// No encoding lives here: this header and node_channel.cpp name no JSON type, and the message
// structs are proto's, brought into `node` below (StatusMsg and StacksMsg excepted: they carry the
// hang watch's RankInput, which proto, a layer down, cannot name; node_channel.cpp converts them
// to and from proto's RankStatus).
//
// Messages (→ direction; every one carries what a peer needs, nothing refers to local state):
//   member → coordinator  join      JoinMsg, first message of a member
//   coordinator → member  joined    JoinedMsg: the join is accepted, the assignment follows when
//                                   the job forms (sent at once: a member that gets no answer
//                                   names the endpoint as no lspawn's; node_group.hpp)
//   coordinator → member  assign    AssignMsg: node rank, run id, worker master, round 0 starts
//   coordinator → member  reject    RejectMsg: the rendezvous failed (reason); the member exits
//   member → coordinator  failed    FailedMsg: a local worker failed (provisional root cause)
//   coordinator → member  stop      StopMsg: stop this round's workers (grace, then SIGKILL)
//   member → coordinator  done      DoneMsg: every local worker of the round has exited
//   coordinator → member  start     StartMsg: a restart, round N begins
//   coordinator → member  finish    FinishMsg: the job is over; the exit code and root cause
//   both ways             hb        heartbeat, every min(1 s, node timeout / 4)
//   both ways             busy      BusyMsg: the sender blocks up to ms without heartbeats (an
//                                   exec'd forkserver loading the program); its next message
//                                   ends the allowance
// Hang diagnosis across nodes (docs/hang-diagnosis.md; the coordinator's watch covers the job):
//   member → coordinator  status    StatusMsg: this node's ranks' status records, when they
//                                   changed (at most every 0.25 s) and with every heartbeat
//   coordinator → member  stacks?   StackAskMsg: ask these ranks of yours for their stacks
//   member → coordinator  stacks    StacksMsg: their main-thread stacks, or why there are none
// A link that sends nothing (not even hb) for the node timeout (beyond a busy allowance), or
// whose connection breaks (EOF, ECONNRESET, TCP_USER_TIMEOUT), is a lost node.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hang/hang_report.hpp"
#include "proto/error.hpp"
#include "proto/node_messages.hpp"
#include "proto/node_wire.hpp"
#include "sys/sys.hpp"

namespace lspawn::node {

// The version of the channel, sent in the join (proto/node_messages.hpp says when it changes).
inline constexpr int kProtocolVersion = proto::kNodeProtocolVersion;
inline constexpr uint32_t kMaxFrame = wire::kMaxNodeFrame;  // 1 MiB: a root-cause report with a backtrace

// The channel speaks proto's node messages: the structs of proto/node_messages.hpp, by the names
// the node group has always used.
using proto::AssignMsg;
using proto::BusyMsg;
using proto::Cause;
using proto::CauseKind;
using proto::DoneMsg;
using proto::FailedMsg;
using proto::FinishMsg;
using proto::Heartbeat;
using proto::JoinedMsg;
using proto::JoinMsg;
using proto::RejectMsg;
using proto::StackAskMsg;
using proto::StartMsg;
using proto::StopMsg;

// "status" as the hang watch reads it: on the wire proto::StatusMsg, each RankInput a
// proto::RankStatus.
struct StatusMsg {
  int restart_count = 0;
  std::vector<RankInput> ranks;  // host set; no stacks
};

// "stacks" as the hang watch reads it: on the wire proto::StacksMsg.
struct StacksMsg {
  int restart_count = 0;
  std::vector<RankInput> ranks;  // rank, stack or stack_problem
};

// A message body as it travels: the CBOR of one of the message structs above (wire::encode_node_body).
struct Body {
  std::string cbor;
  bool operator==(const Body& o) const { return cbor == o.cbor; }
  bool operator!=(const Body& o) const { return cbor != o.cbor; }
};

// The body of `msg`, one of the message structs above (JoinMsg … StacksMsg, Heartbeat).
template <class T>
Body body_of(const T& msg);

// The assignments of many nodes, which differ in node_rank alone: the other fields (the hosts of
// every node among them) are encoded once (wire::AssignEncoder), so assigning K nodes costs O(K)
// bytes of encoding per node's share and not an encoding of all K hosts per node (O(K^2): seconds
// at 4,096 nodes). A body decodes as body_of(AssignMsg) with that node_rank.
class AssignBodies {
 public:
  explicit AssignBodies(const AssignMsg& common) : encoder_(common) {}
  Body for_node(int node_rank) const { return Body{encoder_.for_node(node_rank)}; }

 private:
  wire::AssignEncoder encoder_;
};

// A body that is not the message its type names (a field of the wrong type or shape). The
// text names the message type and the field problem.
class BadMessage : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

// One decoded frame: its type and body.
struct Message {
  std::string type;
  Body body;
  // The body as T (one of the message structs above); a missing field takes its default.
  // Throws BadMessage.
  template <class T>
  T as() const;
};

// The frame of `type` with `body` (length prefix included). Throws LinkError above kMaxFrame.
std::string encode(const std::string& type, const Body& body);
template <class T>
std::string encode(const std::string& type, const T& msg) {
  return encode(type, body_of(msg));
}

// A broken or misbehaving link: EOF, a socket error, a bad frame, a heartbeat timeout.
class LinkError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

// One connection to a peer lspawn: framed reads and buffered non-blocking writes, with the
// times of the last message in and out (for heartbeats and the node timeout).
class Link {
 public:
  // Its buffers keep up to this much capacity between messages, so a link costs the same after
  // one large message (a coordinator's links: memory O(1) per node).
  static constexpr size_t kKeptBuffer = 4096;
  Link(sys::Fd fd, std::string peer);
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }  // "node 1 (lsp-b, 10.77.0.2)" once known
  void set_peer(std::string p) { peer_ = std::move(p); }

  // Queues a frame and sends what the socket takes now. Throws LinkError when the connection
  // is broken.
  void send(const std::string& type, const Body& body);
  template <class T>
  void send(const std::string& type, const T& msg) {
    send(type, body_of(msg));
  }
  // Sends what is queued (after a partial write). Throws LinkError.
  void flush();
  bool pending() const { return !out_.empty(); }
  // Reads what is available; returns the complete messages (heartbeats included). Throws
  // LinkError on EOF ("connection closed", or "connection closed inside a frame (N bytes of
  // it)"), a socket error, or a bad frame ("bad frame: ...").
  std::vector<Message> read();

  // The capacity its buffers hold now: at most 2 x kKeptBuffer once its messages are through.
  size_t buffered_capacity() const { return in_.capacity() + out_.capacity(); }
  // Restarts the heartbeat clocks (when the job has formed: the wait for the last node to join
  // is not silence).
  void touch() { last_in_ = last_out_ = sys::Clock::now(); }
  sys::Clock::time_point last_in() const { return last_in_; }
  sys::Clock::time_point last_out() const { return last_out_; }

 private:
  sys::Fd fd_;
  std::string peer_;
  std::string in_, out_;
  sys::Clock::time_point last_in_, last_out_;
};

}  // namespace lspawn::node
