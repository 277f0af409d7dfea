#include "cluster/node_channel.hpp"

#include <cstring>
#include <utility>

#include "proto/node_wire.hpp"

namespace lspawn::node {

namespace {

// ---- the hang watch's records as proto carries them, field for field ---------------------------

proto::GroupRecord to_wire(const status::GroupView& g) {
  proto::GroupRecord w;
  w.name = g.name;
  w.group_rank = g.group_rank;
  w.group_size = g.group_size;
  w.in_collective = g.in_collective;
  w.seq = g.seq;
  w.op = g.op;
  w.bytes = g.bytes;
  w.since_us = g.since_us;
  w.completed_seq = g.completed_seq;
  w.completed_op = g.completed_op;
  w.completed_us = g.completed_us;
  w.version = g.version;
  return w;
}

status::GroupView from_wire(proto::GroupRecord&& w) {
  status::GroupView g;
  g.name = std::move(w.name);
  g.group_rank = w.group_rank;
  g.group_size = w.group_size;
  g.in_collective = w.in_collective;
  g.seq = w.seq;
  g.op = std::move(w.op);
  g.bytes = w.bytes;
  g.since_us = w.since_us;
  g.completed_seq = w.completed_seq;
  g.completed_op = std::move(w.completed_op);
  g.completed_us = w.completed_us;
  g.version = w.version;
  return g;
}

proto::RankRecord to_wire(const status::RankView& v) {
  proto::RankRecord w;
  w.rank = v.rank;
  w.pid = v.pid;
  w.opened_us = v.opened_us;
  w.stack_signal = v.stack_signal;
  for (const auto& g : v.groups) w.groups.push_back(to_wire(g));
  w.groups_dropped = v.groups_dropped;
  w.torn = v.torn;
  return w;
}

status::RankView from_wire(proto::RankRecord&& w) {
  status::RankView v;
  v.rank = w.rank;
  v.pid = w.pid;
  v.opened_us = w.opened_us;
  v.stack_signal = w.stack_signal;
  for (auto& g : w.groups) v.groups.push_back(from_wire(std::move(g)));
  v.groups_dropped = w.groups_dropped;
  v.torn = w.torn;
  return v;
}

proto::RankStatus to_wire(const RankInput& in) {
  proto::RankStatus w;
  w.rank = in.rank;
  w.pid = in.pid;
  w.host = in.host;
  w.exited = in.exited;
  w.exit_text = in.exit_text;
  w.started_us = in.started_us;
  if (in.record) w.record = to_wire(*in.record);
  w.record_problem = in.record_problem;
  w.stack = in.stack;
  w.stack_problem = in.stack_problem;
  return w;
}

RankInput from_wire(proto::RankStatus&& w) {
  RankInput in;
  in.rank = w.rank;
  in.pid = w.pid;
  in.host = std::move(w.host);
  in.exited = w.exited;
  in.exit_text = std::move(w.exit_text);
  in.started_us = w.started_us;
  if (w.record) in.record = from_wire(std::move(*w.record));
  in.record_problem = std::move(w.record_problem);
  in.stack = std::move(w.stack);
  in.stack_problem = std::move(w.stack_problem);
  return in;
}

// ---- each message as proto's struct ------------------------------------------------------------

// The messages that are proto's structs travel as they are.
template <class T>
const T& on_wire(const T& msg) {
  return msg;
}
template <class T>
void off_wire(T&& w, T& msg) {
  msg = std::move(w);
}
template <class T>
struct WireOf {
  using type = T;
};

// StatusMsg and StacksMsg: each RankInput a proto::RankStatus.
template <class Wire, class Msg>
Wire ranks_on_wire(const Msg& msg) {
  Wire w;
  w.restart_count = msg.restart_count;
  w.ranks.reserve(msg.ranks.size());
  for (const auto& in : msg.ranks) w.ranks.push_back(to_wire(in));
  return w;
}
template <class Wire, class Msg>
void ranks_off_wire(Wire&& w, Msg& msg) {
  msg.restart_count = w.restart_count;
  msg.ranks.clear();
  msg.ranks.reserve(w.ranks.size());
  for (auto& r : w.ranks) msg.ranks.push_back(from_wire(std::move(r)));
}

proto::StatusMsg on_wire(const StatusMsg& msg) { return ranks_on_wire<proto::StatusMsg>(msg); }
void off_wire(proto::StatusMsg&& w, StatusMsg& msg) { ranks_off_wire(std::move(w), msg); }
template <>
struct WireOf<StatusMsg> {
  using type = proto::StatusMsg;
};

proto::StacksMsg on_wire(const StacksMsg& msg) { return ranks_on_wire<proto::StacksMsg>(msg); }
void off_wire(proto::StacksMsg&& w, StacksMsg& msg) { ranks_off_wire(std::move(w), msg); }
template <>
struct WireOf<StacksMsg> {
  using type = proto::StacksMsg;
};

}  // namespace

template <class T>
Body body_of(const T& msg) {
  return Body{wire::encode_node_body(on_wire(msg))};
}

template <class T>
T Message::as() const {
  typename WireOf<T>::type w;
  try {
    wire::decode_node_body(body.cbor, w);
  } catch (const wire::WireError& e) {
    throw BadMessage("body of '" + type + "': " + e.what());
  }
  T msg;
  off_wire(std::move(w), msg);
  return msg;
}

// The message types, instantiated here (the only place that sees their conversion).
#define LSPAWN_NODE_MESSAGE(T)        \
  template Body body_of<T>(const T&); \
  template T Message::as<T>() const;
LSPAWN_NODE_MESSAGE(JoinMsg)
LSPAWN_NODE_MESSAGE(JoinedMsg)
LSPAWN_NODE_MESSAGE(AssignMsg)
LSPAWN_NODE_MESSAGE(RejectMsg)
LSPAWN_NODE_MESSAGE(FailedMsg)
LSPAWN_NODE_MESSAGE(StopMsg)
LSPAWN_NODE_MESSAGE(DoneMsg)
LSPAWN_NODE_MESSAGE(BusyMsg)
LSPAWN_NODE_MESSAGE(StartMsg)
LSPAWN_NODE_MESSAGE(FinishMsg)
LSPAWN_NODE_MESSAGE(StatusMsg)
LSPAWN_NODE_MESSAGE(StackAskMsg)
LSPAWN_NODE_MESSAGE(StacksMsg)
LSPAWN_NODE_MESSAGE(Heartbeat)
#undef LSPAWN_NODE_MESSAGE

std::string encode(const std::string& type, const Body& body) {
  try {
    return wire::encode_node_frame(type, body.cbor, kMaxFrame);
  } catch (const wire::WireError& e) {
    throw LinkError(e.what());
  }
}

Link::Link(sys::Fd fd, std::string peer)
    : fd_(std::move(fd)), peer_(std::move(peer)), last_in_(sys::Clock::now()), last_out_(last_in_) {}

void Link::send(const std::string& type, const Body& body) {
  out_ += encode(type, body);
  flush();
}

void Link::flush() {
  while (!out_.empty()) {
    ssize_t n;
    try {
      n = sys::send_some(fd_.get(), out_.data(), out_.size(), "control channel to " + peer_);
    } catch (const sys::SysError& e) {
      throw LinkError(std::string("connection broken (") + std::strerror(e.error()) + ")");
    }
    if (n < 0) return;  // full: the rest goes on the next flush
    out_.erase(0, static_cast<size_t>(n));
    last_out_ = sys::Clock::now();
  }
  // A large message (an assignment names every host: 40 KB at 4,096 nodes) leaves no capacity
  // behind: a coordinator holds a link per node, and that would be O(nodes) bytes per node.
  if (out_.capacity() > kKeptBuffer) std::string().swap(out_);
}

std::vector<Message> Link::read() {
  std::vector<Message> msgs;
  bool eof = false;
  char buf[16 * 1024];
  for (;;) {
    ssize_t n;
    try {
      n = sys::read_some(fd_.get(), buf, sizeof buf, "control channel from " + peer_);
    } catch (const sys::SysError& e) {
      throw LinkError(std::string("connection broken (") + std::strerror(e.error()) + ")");
    }
    if (n < 0) break;  // nothing more now
    if (n == 0) {
      eof = true;
      break;
    }
    in_.append(buf, static_cast<size_t>(n));
    // Less than asked for: the socket is empty now (a read more would only say so; an EOF that
    // follows wakes the caller again).
    if (static_cast<size_t>(n) < sizeof buf) break;
    if (in_.size() > kMaxFrame + 4 + sizeof buf) break;  // parse before reading more
  }
  size_t pos = 0;
  for (;;) {
    wire::NodeFrame frame;
    size_t used = 0;
    try {
      used = wire::decode_node_frame(in_.data() + pos, in_.size() - pos, frame, kMaxFrame);
    } catch (const wire::WireError& e) {
      throw LinkError(std::string("bad frame: ") + e.what());
    }
    if (used == 0) break;
    msgs.push_back(Message{std::move(frame.type), Body{std::move(frame.body)}});
    pos += used;
  }
  in_.erase(0, pos);
  if (in_.empty() && in_.capacity() > kKeptBuffer) std::string().swap(in_);
  if (!msgs.empty()) last_in_ = sys::Clock::now();
  // At EOF, the messages before it first (a "finish" then the peer's exit); the next read()
  // sees the EOF again and throws.
  if (eof && msgs.empty()) {
    if (!in_.empty()) {
      throw LinkError("connection closed inside a frame (" + std::to_string(in_.size()) + " bytes of it)");
    }
    throw LinkError("connection closed");
  }
  return msgs;
}

}  // namespace lspawn::node
