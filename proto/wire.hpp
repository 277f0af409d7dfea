// Bounded framing of lspawn.proto messages over file descriptors, and JSON files.
//
// Frame: 4-byte little-endian payload length, then the serialized message. A length above the
// reader's bound is rejected before any allocation, so a corrupt or hostile peer cannot make the
// reader allocate more than `max_bytes`. Every message type carries `version`; a newer version
// than kSchemaVersion is rejected with both numbers in the error.
//
// Thread-safety: none; one reader and one writer per fd.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <google/protobuf/message_lite.h>

namespace google::protobuf { class Message; }

namespace lspawn::wire {

// Current schema version written into every message's `version` field.
inline constexpr uint32_t kSchemaVersion = 1;
// Default bound of one frame; spawn arguments with tensors may raise it explicitly.
inline constexpr uint32_t kDefaultMaxFrame = 64u << 20;

// A frame or file that is malformed, too large, truncated, or of a newer schema version.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Peer closed the stream cleanly before the first byte of a frame.
class EndOfStream : public WireError {
 public:
  using WireError::WireError;
};

// Writes one frame. Retries EINTR and short writes; throws WireError naming `what` and errno.
void write_frame(int fd, const google::protobuf::MessageLite& msg, const char* what);

// Reads one frame into `msg`. Throws EndOfStream on clean EOF before the frame, WireError on a
// truncated frame, an oversize length (> max_bytes), unparsable bytes, or a newer version.
// Blocking; use on a blocking fd or one known readable with a whole frame pending.
void read_frame(int fd, google::protobuf::MessageLite& msg, const char* what,
                uint32_t max_bytes = kDefaultMaxFrame);

// Encodes/decodes a frame to/from memory (used by non-blocking readers that buffer bytes).
std::string encode_frame(const google::protobuf::MessageLite& msg);
// If `buf` holds a whole frame, parses it into msg, erases it from buf and returns true.
bool try_decode_frame(std::string& buf, google::protobuf::MessageLite& msg, const char* what,
                      uint32_t max_bytes = kDefaultMaxFrame);

// JSON files (error reports). write_json_file writes atomically (temp file + rename) so a reader
// never sees half a report. read_json_file bounds the file at max_bytes.
void write_json_file(const std::string& path, const google::protobuf::Message& msg);
void read_json_file(const std::string& path, google::protobuf::Message& msg,
                    uint32_t max_bytes = 1u << 20);

// Throws WireError if `version` is newer than kSchemaVersion; `what` names the message.
void check_version(uint32_t version, const char* what);

}  // namespace lspawn::wire
