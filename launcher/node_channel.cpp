#include "launcher/node_channel.hpp"

#include <cstring>

namespace lspawn::node {

std::string encode(const std::string& type, const nlohmann::json& body) {
  const nlohmann::json j = {{"t", type}, {"m", body}};
  const std::vector<uint8_t> cbor = nlohmann::json::to_cbor(j);
  if (cbor.size() > kMaxFrame) {
    throw LinkError("message '" + type + "' of " + std::to_string(cbor.size()) +
                    " bytes exceeds the frame limit of " + std::to_string(kMaxFrame));
  }
  const uint32_t n = static_cast<uint32_t>(cbor.size());
  std::string out;
  out.reserve(4 + n);
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((n >> s) & 0xff));
  out.append(reinterpret_cast<const char*>(cbor.data()), cbor.size());
  return out;
}

Link::Link(sys::Fd fd, std::string peer)
    : fd_(std::move(fd)), peer_(std::move(peer)), last_in_(sys::Clock::now()), last_out_(last_in_) {}

void Link::send(const std::string& type, const nlohmann::json& body) {
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
      m.body = j.at("m");
    } catch (const nlohmann::json::exception& e) {
      throw LinkError(std::string("bad frame: ") + e.what());
    }
    msgs.push_back(std::move(m));
    pos += 4 + len;
  }
  in_.erase(0, pos);
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
