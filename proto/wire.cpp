#include "proto/wire.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>

namespace lspawn::wire {
namespace {

std::string errno_text(const char* call, const char* what, int err) {
  return std::string(call) + " (" + what + "): " + std::strerror(err);
}

void write_all(int fd, const char* p, size_t n, const char* what) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw WireError(errno_text("write", what, errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Returns bytes read; fewer than n only at EOF.
size_t read_all(int fd, char* p, size_t n, const char* what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw WireError(errno_text("read", what, errno));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

uint32_t decode_len(const unsigned char* b) {
  return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
}

void check_len(uint32_t len, uint32_t max_bytes, const char* what) {
  if (len > max_bytes) {
    throw WireError(std::string(what) + ": frame of " + std::to_string(len) +
                    " bytes exceeds the bound of " + std::to_string(max_bytes) + " bytes");
  }
}

void check_message_version(const google::protobuf::MessageLite& msg, const char* what);

void parse(google::protobuf::MessageLite& msg, const char* data, size_t n, const char* what) {
  if (!msg.ParseFromArray(data, static_cast<int>(n))) {
    throw WireError(std::string(what) + ": malformed " + msg.GetTypeName() + " (" +
                    std::to_string(n) + " bytes)");
  }
  check_message_version(msg, what);
}

// Every top-level message of lspawn.proto has `uint32 version = 1`; messages without one (Value,
// ValueList) are nested only and pass.
void check_message_version(const google::protobuf::MessageLite& msg, const char* what) {
  const auto* full = dynamic_cast<const google::protobuf::Message*>(&msg);
  if (full == nullptr) return;
  const auto* field = full->GetDescriptor()->FindFieldByName("version");
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT32) return;
  check_version(full->GetReflection()->GetUInt32(*full, field),
                (std::string(what) + ": " + msg.GetTypeName()).c_str());
}

}  // namespace

void check_version(uint32_t version, const char* what) {
  if (version > kSchemaVersion) {
    throw WireError(std::string(what) + ": message schema version " + std::to_string(version) +
                    " is newer than this build's " + std::to_string(kSchemaVersion));
  }
}

std::string encode_frame(const google::protobuf::MessageLite& msg) {
  std::string body;
  if (!msg.SerializeToString(&body)) {
    throw WireError("cannot serialize " + msg.GetTypeName());
  }
  if (body.size() > UINT32_MAX) throw WireError("message too large: " + msg.GetTypeName());
  const auto len = static_cast<uint32_t>(body.size());
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += body;
  return out;
}

void write_frame(int fd, const google::protobuf::MessageLite& msg, const char* what) {
  const std::string frame = encode_frame(msg);
  write_all(fd, frame.data(), frame.size(), what);
}

void read_frame(int fd, google::protobuf::MessageLite& msg, const char* what, uint32_t max_bytes) {
  unsigned char hdr[4];
  const size_t h = read_all(fd, reinterpret_cast<char*>(hdr), 4, what);
  if (h == 0) throw EndOfStream(std::string(what) + ": end of stream");
  if (h < 4) throw WireError(std::string(what) + ": truncated frame header");
  const uint32_t len = decode_len(hdr);
  check_len(len, max_bytes, what);
  std::string body(len, '\0');
  if (read_all(fd, body.data(), len, what) < len) {
    throw WireError(std::string(what) + ": truncated frame (expected " + std::to_string(len) +
                    " bytes)");
  }
  parse(msg, body.data(), len, what);
}

bool try_decode_frame(std::string& buf, google::protobuf::MessageLite& msg, const char* what,
                      uint32_t max_bytes) {
  if (buf.size() < 4) return false;
  const uint32_t len = decode_len(reinterpret_cast<const unsigned char*>(buf.data()));
  check_len(len, max_bytes, what);
  if (buf.size() < 4 + size_t(len)) return false;
  parse(msg, buf.data() + 4, len, what);
  buf.erase(0, 4 + size_t(len));
  return true;
}

void write_json_file(const std::string& path, const google::protobuf::Message& msg) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  opts.add_whitespace = true;
  auto st = google::protobuf::util::MessageToJsonString(msg, &json, opts);
  if (!st.ok()) throw WireError("cannot encode " + path + " as JSON: " + st.ToString());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw WireError(errno_text("open", tmp.c_str(), errno));
  try {
    write_all(fd, json.data(), json.size(), tmp.c_str());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw WireError(errno_text("rename", path.c_str(), err));
  }
}

void read_json_file(const std::string& path, google::protobuf::Message& msg, uint32_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw WireError(errno_text("open", path.c_str(), errno));
  std::string data(size_t(max_bytes) + 1, '\0');
  size_t n;
  try {
    n = read_all(fd, data.data(), data.size(), path.c_str());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (n > max_bytes) {
    throw WireError(path + ": larger than the bound of " + std::to_string(max_bytes) + " bytes");
  }
  data.resize(n);
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  auto st = google::protobuf::util::JsonStringToMessage(data, &msg, opts);
  if (!st.ok()) throw WireError(path + ": not a valid " + msg.GetTypeName() + ": " + st.ToString());
  check_message_version(msg, path.c_str());
}

}  // namespace lspawn::wire
