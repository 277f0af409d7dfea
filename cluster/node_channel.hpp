// The control channel between the lspawn processes of a multi-node job (docs/multi-node.md).
//
// `launcher/` never links LibTorch, so the launchers do not use c10d's store: one lspawn (the
// coordinator, node 0 in static mode) listens on the rendezvous endpoint, every other one
// connects to it, and they exchange the small messages below over that TCP connection.
//
// Wire format: each message is a frame = 4-byte big-endian length + a CBOR map
// {"t": type, "m": body}, the body a CBOR map from field name to value (unknown fields ignored,
// missing ones take their defaults). A length above kMaxFrame closes the link before anything
// is allocated; a frame that is not valid CBOR also closes it (Link::read throws LinkError); a
// body of the wrong shape is a BadMessage when it is read (Message::as).
//
// The encoding (nlohmann::json) stays inside node_channel.cpp: this header names no JSON type,
// so a target that includes it compiles the same whichever nlohmann, or none, its include path
// finds (tests/headers checks every header for that).
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
#include "sys/sys.hpp"

namespace lspawn::node {

// 2: the coordinator answers a join at once ("joined"). Nodes of another version are rejected.
inline constexpr int kProtocolVersion = 2;
inline constexpr uint32_t kMaxFrame = 1u << 20;  // 1 MiB: a root-cause report with a backtrace

// Why a job (or a round) failed: the one root cause every lspawn reports.
struct Cause {
  std::string kind = "worker";  // "worker" | "node-lost" | "signal" | "hang" | "membership"
  int restart_count = 0;        // the round it happened in
  int rank = -1;                // worker: its global rank
  int node_rank = -1;           // where it happened (node-lost: the node that was lost)
  std::string host;
  int exit_code = 1;            // what every lspawn exits with
  int64_t time_us = 0;          // wall clock when it failed (the earliest failure wins)
  std::string text;             // the report, lines starting "lspawn: ", ending with '\n'
  bool before_rendezvous = false;  // worker: it failed before it entered its rendezvous (status/phase.hpp)
};

struct JoinMsg {
  int version = kProtocolVersion;
  std::string host;
  int node_rank = -1;  // -1: assign one
  int nnodes = 0;           // --nnodes N, or MAX of MIN:MAX
  int min_nnodes = 0;       // MIN of --nnodes MIN:MAX; 0: a fixed count
  int nproc_per_node = 0;
  int max_restarts = 0;
  std::string run_id;       // empty: none given
  std::string worker_addr;  // where this node's rank 0 would host the workers' store
  int worker_port = 0;      // a port reserved there; 0: none (cannot be node 0)
};

struct JoinedMsg {
  int joined = 0;  // nodes that had joined (this one and the coordinator included)
};

struct AssignMsg {
  int node_rank = 0;
  int nnodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 0;
  std::string run_id;
  std::string master_addr;  // MASTER_ADDR / MASTER_PORT of every worker
  int master_port = 0;
  std::vector<std::string> hosts;  // by node rank
  int coordinator = 0;             // node rank of the coordinator
  // The round this assignment starts: 0 at the rendezvous. An elastic job sends a new
  // assignment before each round whose nodes changed (and to a node admitted later).
  int restart_count = 0;
  int restarts_used = 0;           // of --max-restarts: rounds started after a failure
};

struct RejectMsg {
  std::string reason;
};

struct FailedMsg {
  Cause cause;
};

struct StopMsg {
  int restart_count = 0;
  Cause cause;
};

struct DoneMsg {
  int restart_count = 0;
  bool failed = false;
  Cause cause;  // this node's settled root cause when failed
};

struct BusyMsg {
  int64_t ms = 0;
};

struct StartMsg {
  int restart_count = 0;
  int restarts_used = 0;  // of --max-restarts (a round that admits a node counts none)
  Cause cause;  // the root cause of the attempt that failed
};

struct FinishMsg {
  int exit_code = 0;
  bool failed = false;
  int restart_count = 0;  // the last round
  Cause cause;
};

}  // namespace lspawn::node

namespace lspawn::node {

struct StatusMsg {
  int restart_count = 0;
  std::vector<RankInput> ranks;  // host set; no stacks
};

struct StackAskMsg {
  int restart_count = 0;
  std::vector<int> ranks;  // global ranks of the receiving node
};

struct StacksMsg {
  int restart_count = 0;
  std::vector<RankInput> ranks;  // rank, stack or stack_problem
};

// A message body as it travels: the CBOR of one of the message structs above.
struct Body {
  std::string cbor;
  bool operator==(const Body& o) const { return cbor == o.cbor; }
  bool operator!=(const Body& o) const { return cbor != o.cbor; }
};

// "hb": a heartbeat has no fields.
struct Heartbeat {};

// The body of `msg`, one of the message structs above (JoinMsg … StacksMsg, Heartbeat).
template <class T>
Body body_of(const T& msg);

// The assignments of many nodes, which differ in node_rank alone: the other fields (the hosts of
// every node among them) are encoded once, so assigning K nodes costs O(K) bytes of encoding per
// node's share and not an encoding of all K hosts per node (O(K^2): seconds at 4,096 nodes). A
// body decodes as body_of(AssignMsg) with that node_rank.
class AssignBodies {
 public:
  explicit AssignBodies(const AssignMsg& common);
  Body for_node(int node_rank) const;

 private:
  std::string shared_;  // the CBOR of every field but node_rank, without the map's header
  size_t fields_ = 0;   // how many
};

// A body that is not the message its type names (a field of the wrong type or shape). The
// text names the message type and the field problem.
class BadMessage : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
class LinkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
