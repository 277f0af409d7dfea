// Bounded framing of the messages of proto/messages.hpp over file descriptors, and JSON files.
//
// Frame: 4-byte little-endian payload length, then the message as a CBOR map from field name to
// value (messages.hpp says how each field is written). A length above the reader's bound is
// rejected before any allocation, so a corrupt or hostile peer cannot make the reader allocate
// more than `max_bytes`; nesting deeper than kMaxNesting levels is rejected while parsing, so it
// cannot exhaust the stack either. Every top-level message carries `version`; a newer version than
// kSchemaVersion is rejected with both numbers in the error. Fields the reader does not know are
// ignored; a field of the wrong type (a string where an integer belongs, an integer out of the
// field's range) is an error naming the message and the field.
//
// `Msg` below is one of the top-level messages: proto::ErrorReport, SpawnCall, SpawnResult,
// ForkRequest, ForkReply, ChildExit, DaemonRequest, DaemonReply (the functions are instantiated for
// those in wire.cpp).
//
// Thread-safety: none; one reader and one writer per fd.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "proto/messages.hpp"
#include "proto/error.hpp"

namespace lspawn::wire {

// Current schema version written into every message's `version` field.
inline constexpr uint32_t kSchemaVersion = 1;
// Default bound of one frame; spawn arguments with tensors may raise it explicitly.
inline constexpr uint32_t kDefaultMaxFrame = 64u << 20;
// Deepest nesting of maps and arrays a reader accepts (a Value list level is two: map + array).
inline constexpr unsigned kMaxNesting = 256;

// A frame or file that is malformed, too large, truncated, or of a newer schema version.
class WireError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

// Peer closed the stream cleanly before the first byte of a frame.
class EndOfStream : public WireError {
 public:
  using WireError::WireError;
};

// Writes one frame. Retries EINTR and short writes; throws WireError naming `what` and errno.
template <class Msg>
void write_frame(int fd, const Msg& msg, const char* what);

// Reads one frame into `msg`. Throws EndOfStream on clean EOF before the frame, WireError on a
// truncated frame, an oversize length (> max_bytes), unparsable bytes, or a newer version.
// Blocking; use on a blocking fd or one known readable with a whole frame pending.
template <class Msg>
void read_frame(int fd, Msg& msg, const char* what, uint32_t max_bytes = kDefaultMaxFrame);

// Encodes/decodes a frame to/from memory (used by non-blocking readers that buffer bytes).
template <class Msg>
std::string encode_frame(const Msg& msg);
// If `buf` holds a whole frame, parses it into msg, erases it from buf and returns true.
template <class Msg>
bool try_decode_frame(std::string& buf, Msg& msg, const char* what, uint32_t max_bytes = kDefaultMaxFrame);

// JSON files (error reports): one object, the field names of messages.hpp, int64 fields as
// numbers (strings of digits are accepted too, as protobuf's JSON mapping wrote them).
// write_json_file writes atomically (temp file + rename) so a reader never sees half a report;
// text that is not UTF-8 is written with U+FFFD in its place. read_json_file bounds the file at
// max_bytes.
void write_json_file(const std::string& path, const proto::ErrorReport& msg);
void write_json_file(const std::string& path, const proto::RunResult& msg);
void read_json_file(const std::string& path, proto::ErrorReport& msg, uint32_t max_bytes = 1u << 20);
void read_json_file(const std::string& path, proto::RunResult& msg, uint32_t max_bytes = 1u << 20);

// The bytes of `path`, at most max_bytes (WireError naming the path when larger or unreadable).
std::string read_bounded_file(const std::string& path, uint32_t max_bytes);

// Throws WireError if `version` is newer than kSchemaVersion; `what` names the message.
void check_version(uint32_t version, const char* what);

}  // namespace lspawn::wire
