#include "cluster/node_channel.hpp"

#include <cstring>

#include <nlohmann/json.hpp>

// std::optional as null or the value (nlohmann 3.11.2 has no serializer for it).
namespace nlohmann {
template <class T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& v) { v ? j = *v : j = nullptr; }
  static void from_json(const json& j, std::optional<T>& v) {
    if (j.is_null()) v.reset();
    else v = j.get<T>();
  }
};
}  // namespace nlohmann

// Field names as keys; a missing field takes its default.
namespace lspawn::status {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(GroupView, name, group_rank, group_size, in_collective, seq, op,
                                                bytes, since_us, completed_seq, completed_op, completed_us,
                                                version)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankView, rank, pid, opened_us, stack_signal, groups,
                                                groups_dropped, torn)
}  // namespace lspawn::status
namespace lspawn {
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankInput, rank, pid, host, exited, exit_text, started_us,
                                                record, record_problem, stack, stack_problem)
}  // namespace lspawn

namespace lspawn::node {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Cause, kind, restart_count, rank, node_rank, host, exit_code, time_us,
                                                text, before_rendezvous)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(JoinMsg, version, host, node_rank, nnodes, min_nnodes, nproc_per_node,
                                                max_restarts, run_id, worker_addr, worker_port)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(JoinedMsg, joined)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AssignMsg, node_rank, nnodes, nproc_per_node, max_restarts, run_id,
                                                master_addr, master_port, hosts, coordinator, restart_count,
                                                restarts_used)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RejectMsg, reason)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FailedMsg, cause)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StopMsg, restart_count, cause)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DoneMsg, restart_count, failed, cause)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BusyMsg, ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StartMsg, restart_count, restarts_used, cause)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FinishMsg, exit_code, failed, restart_count, cause)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StatusMsg, restart_count, ranks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StackAskMsg, restart_count, ranks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(StacksMsg, restart_count, ranks)
void to_json(nlohmann::json& j, const Heartbeat&) { j = nlohmann::json::object(); }
void from_json(const nlohmann::json&, Heartbeat&) {}

template <class T>
Body body_of(const T& msg) {
  const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(nlohmann::json(msg));
  return Body{std::string(cbor.begin(), cbor.end())};
}

template <class T>
T Message::as() const {
  try {
    return nlohmann::json::from_cbor(body.cbor).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw BadMessage("body of '" + type + "': " + e.what());
  }
}

namespace {
// A CBOR map's header for `n` pairs (RFC 8949 §3.1: major type 5).
std::string cbor_map_header(size_t n) {
  std::string h;
  if (n < 24) {
    h.push_back(static_cast<char>(0xa0 | n));
  } else {
    h.push_back(static_cast<char>(0xb8));  // one byte of count follows (an AssignMsg has a dozen)
    h.push_back(static_cast<char>(n));
  }
  return h;
}
size_t cbor_map_header_size(uint8_t first) { return (first & 0x1f) < 24 ? 1 : 2; }
}  // namespace

AssignBodies::AssignBodies(const AssignMsg& common) {
  nlohmann::json j = common;
  j.erase("node_rank");
  fields_ = j.size();
  const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(j);
  shared_.assign(cbor.begin() + static_cast<long>(cbor_map_header_size(cbor[0])), cbor.end());
}

Body AssignBodies::for_node(int node_rank) const {
  const std::vector<uint8_t> pair = nlohmann::json::to_cbor(nlohmann::json{{"node_rank", node_rank}});
  Body b;
  b.cbor = cbor_map_header(fields_ + 1);
  b.cbor.append(pair.begin() + 1, pair.end());  // a map of one: its header is one byte
  b.cbor += shared_;
  return b;
}

// The message types, instantiated here (the only place that sees their encoding).
#define LSPAWN_NODE_MESSAGE(T)            \
  template Body body_of<T>(const T&);     \
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

namespace {
// A CBOR text string's head (RFC 8949 major type 3) followed by the text.
void append_cbor_text(std::string& out, const std::string& text) {
  const size_t n = text.size();
  if (n < 24) {
    out.push_back(static_cast<char>(0x60 | n));
  } else if (n < 256) {
    out.push_back(static_cast<char>(0x78));
    out.push_back(static_cast<char>(n));
  } else {
    out.push_back(static_cast<char>(0x7a));
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((n >> s) & 0xff));
  }
  out += text;
}
}  // namespace

std::string encode(const std::string& type, const Body& body) {
  // {"t": type, "m": body}: a map of two, the body's CBOR as it is.
  std::string cbor;
  cbor.reserve(8 + type.size() + body.cbor.size());
  cbor.push_back(static_cast<char>(0xa2));
  append_cbor_text(cbor, "t");
  append_cbor_text(cbor, type);
  append_cbor_text(cbor, "m");
  cbor += body.cbor.empty() ? std::string(1, static_cast<char>(0xa0)) : body.cbor;
  if (cbor.size() > kMaxFrame) {
    throw LinkError("message '" + type + "' of " + std::to_string(cbor.size()) +
                    " bytes exceeds the frame limit of " + std::to_string(kMaxFrame));
  }
  const uint32_t n = static_cast<uint32_t>(cbor.size());
  std::string out;
  out.reserve(4 + n);
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((n >> s) & 0xff));
  out += cbor;
  return out;
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
  while (in_.size() - pos >= 4) {
    uint32_t len = 0;
    for (int k = 0; k < 4; ++k) len = (len << 8) | static_cast<uint8_t>(in_[pos + k]);
    if (len > kMaxFrame) {
      throw LinkError("bad frame: length " + std::to_string(len) + " exceeds " + std::to_string(kMaxFrame));
    }
    if (in_.size() - pos - 4 < len) break;
    Message m;
    try {
      const auto j = nlohmann::json::from_cbor(in_.begin() + static_cast<long>(pos + 4),
                                               in_.begin() + static_cast<long>(pos + 4 + len));
      m.type = j.at("t").get<std::string>();
      const std::vector<uint8_t> body = nlohmann::json::to_cbor(j.at("m"));
      m.body.cbor.assign(body.begin(), body.end());
    } catch (const nlohmann::json::exception& e) {
      throw LinkError(std::string("bad frame: ") + e.what());
    }
    msgs.push_back(std::move(m));
    pos += 4 + len;
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
