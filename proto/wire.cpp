#include "proto/wire.hpp"
#include "proto/error.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <optional>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/node_wire.hpp"
#include "proto/schema.hpp"

namespace lspawn::wire {
namespace {

using json = nlohmann::json;
using proto::ChildExit;
using proto::DaemonReply;
using proto::DaemonRequest;
using proto::ErrorReport;
using proto::ForkReply;
using proto::ForkRequest;
using proto::RunResult;
using proto::SpawnCall;
using proto::SpawnResult;
using proto::Value;
using proto::ValueList;

using proto::schema::each_field;
using proto::schema::kIsRecord;
using proto::schema::type_name;

// Value kinds on the wire: a map with one entry named after the kind (the field names of the
// former protobuf oneof); an empty map is kNone, an unknown name (a newer writer) too.
constexpr struct {
  const char* name;
  Value::Kind kind;
} kValueKeys[] = {
    {"i", Value::Kind::kInt},     {"f", Value::Kind::kDouble},      {"b", Value::Kind::kBool},
    {"s", Value::Kind::kString},  {"tensor", Value::Kind::kTensor}, {"list", Value::Kind::kList},
    {"blob", Value::Kind::kBlob},
};

const char* value_key(Value::Kind kind) {
  for (const auto& k : kValueKeys) {
    if (k.kind == kind) return k.name;
  }
  return nullptr;
}

// ---- encoding ------------------------------------------------------------------------------

json to_doc(const Value& v);

json bytes_doc(const std::string& s) { return json::binary(std::vector<std::uint8_t>(s.begin(), s.end())); }

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

// A record as a map of its fields, a vector as an array, an empty optional as null.
template <class T>
json to_doc(const T& x) {
  if constexpr (kIsRecord<T>) {
    json j = json::object();
    each_field(x, [&](const char* name, const auto& member) { j[name] = to_doc(member); });
    return j;
  } else if constexpr (IsOptional<T>::value) {
    return x ? to_doc(*x) : json(nullptr);
  } else if constexpr (IsVector<T>::value) {
    json j = json::array();
    for (const auto& item : x) j.push_back(to_doc(item));
    return j;
  } else if constexpr (std::is_same_v<T, proto::CauseKind>) {
    return json(proto::cause_kind_name(x));  // its name: the wire of protocol 2
  } else {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, std::string>);
    return json(x);
  }
}

json to_doc(const Value& v) {
  json j = json::object();
  const char* key = value_key(v.kind);
  switch (v.kind) {
    case Value::Kind::kNone: break;
    case Value::Kind::kInt: j[key] = v.i; break;
    case Value::Kind::kDouble: j[key] = v.f; break;
    case Value::Kind::kBool: j[key] = v.b; break;
    case Value::Kind::kString: j[key] = v.s; break;
    case Value::Kind::kTensor:
    case Value::Kind::kBlob: j[key] = bytes_doc(v.s); break;
    case Value::Kind::kList: j[key] = to_doc(v.list); break;
  }
  return j;
}

// ---- decoding: every type checked, nothing trusted -----------------------------------------

// A document that parsed but does not fit the schema; decode() adds what and the message type.
class SchemaError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& got) {
  throw SchemaError(field + ": expected " + expected + ", got " + got.type_name());
}

// "123", "-5": how protobuf's JSON mapping wrote 64-bit integers ("pid": "123").
bool is_decimal(const std::string& s) {
  const size_t first = !s.empty() && s[0] == '-' ? 1 : 0;
  if (s.size() == first || s.size() - first > 20) return false;
  for (size_t k = first; k < s.size(); ++k) {
    if (s[k] < '0' || s[k] > '9') return false;
  }
  return true;
}

[[noreturn]] void out_of_range(const std::string& field, const std::string& value) {
  throw SchemaError(field + ": " + value + " is out of the field's range");
}

// An integer field: a CBOR/JSON integer, or a string of decimal digits; range-checked into Int.
template <class Int>
std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>> from_doc(const json& j, Int& out,
                                                                                 const std::string& field) {
  constexpr Int lo = std::numeric_limits<Int>::min();
  constexpr Int hi = std::numeric_limits<Int>::max();
  if (j.is_null()) return;
  int64_t si = 0;
  uint64_t ui = 0;
  bool is_unsigned = false;
  if (j.is_number_unsigned()) {
    ui = j.get<uint64_t>();
    is_unsigned = true;
  } else if (j.is_number_integer()) {
    si = j.get<int64_t>();
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (!is_decimal(s)) wrong_type(field, "an integer", j);
    errno = 0;
    if (s[0] == '-') {
      si = std::strtoll(s.c_str(), nullptr, 10);
    } else {
      ui = std::strtoull(s.c_str(), nullptr, 10);
      is_unsigned = true;
    }
    if (errno == ERANGE) out_of_range(field, s);
  } else {
    wrong_type(field, "an integer", j);
  }
  if (is_unsigned) {
    if (ui > static_cast<uint64_t>(hi)) out_of_range(field, std::to_string(ui));
    out = static_cast<Int>(ui);
  } else {
    if (si < static_cast<int64_t>(lo) || (si > 0 && static_cast<uint64_t>(si) > static_cast<uint64_t>(hi))) {
      out_of_range(field, std::to_string(si));
    }
    out = static_cast<Int>(si);
  }
}

void from_doc(const json& j, bool& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_boolean()) wrong_type(field, "a boolean", j);
  out = j.get<bool>();
}

void from_doc(const json& j, double& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_number()) wrong_type(field, "a number", j);
  out = j.get<double>();
}

void from_doc(const json& j, std::string& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_string()) wrong_type(field, "a string", j);
  out = j.get_ref<const std::string&>();
}

void from_doc(const json& j, proto::CauseKind& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_string()) wrong_type(field, "a cause kind (a string)", j);
  const auto kind = proto::parse_cause_kind(j.get_ref<const std::string&>());
  if (!kind) {
    throw SchemaError(field + ": '" + j.get_ref<const std::string&>() +
                      "' is no cause kind (worker, node-lost, signal, hang, membership)");
  }
  out = *kind;
}

void from_doc(const json& j, std::vector<std::string>& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_array()) wrong_type(field, "an array of strings", j);
  out.clear();
  for (size_t k = 0; k < j.size(); ++k) {
    out.emplace_back();
    from_doc(j[k], out.back(), field + "[" + std::to_string(k) + "]");
  }
}

void from_doc(const json& j, Value& out, const std::string& field);
template <class T>
void from_doc(const json& j, std::vector<T>& out, const std::string& field);
template <class T>
void from_doc(const json& j, std::optional<T>& out, const std::string& field);
template <class M>
std::enable_if_t<kIsRecord<M>> from_doc(const json& j, M& out, const std::string& field);

void from_doc(const json& j, ValueList& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_array()) wrong_type(field, "an array of values", j);
  out.clear();
  for (size_t k = 0; k < j.size(); ++k) {
    out.emplace_back();
    from_doc(j[k], out.back(), field + "[" + std::to_string(k) + "]");
  }
}

void bytes_from_doc(const json& j, std::string& out, const std::string& field) {
  if (!j.is_binary()) wrong_type(field, "a byte string", j);
  const auto& b = j.get_binary();
  out.assign(b.begin(), b.end());
}

void from_doc(const json& j, Value& out, const std::string& field) {
  out = Value();
  if (j.is_null()) return;
  if (!j.is_object()) wrong_type(field, "a value (a map of one entry)", j);
  const char* found = nullptr;
  for (const auto& k : kValueKeys) {
    auto it = j.find(k.name);
    if (it == j.end()) continue;
    if (found != nullptr) {
      throw SchemaError(field + ": a value of two kinds, " + found + " and " + k.name);
    }
    found = k.name;
    const std::string where = field + "." + k.name;
    out.kind = k.kind;
    switch (k.kind) {
      case Value::Kind::kNone: break;
      case Value::Kind::kInt: from_doc(*it, out.i, where); break;
      case Value::Kind::kDouble: from_doc(*it, out.f, where); break;
      case Value::Kind::kBool: from_doc(*it, out.b, where); break;
      case Value::Kind::kString: from_doc(*it, out.s, where); break;
      case Value::Kind::kTensor:
      case Value::Kind::kBlob: bytes_from_doc(*it, out.s, where); break;
      case Value::Kind::kList: from_doc(*it, out.list, where); break;
    }
  }
}

// Any other vector (of integers, of records): an array; an item of the wrong type names its index.
template <class T>
void from_doc(const json& j, std::vector<T>& out, const std::string& field) {
  if (j.is_null()) return;
  if (!j.is_array()) wrong_type(field, "an array", j);
  out.clear();
  for (size_t k = 0; k < j.size(); ++k) {
    out.emplace_back();
    from_doc(j[k], out.back(), field + "[" + std::to_string(k) + "]");
  }
}

// null: none; anything else: the value.
template <class T>
void from_doc(const json& j, std::optional<T>& out, const std::string& field) {
  out.reset();
  if (j.is_null()) return;
  out.emplace();
  from_doc(j, *out, field);
}

template <class M>
std::enable_if_t<kIsRecord<M>> from_doc(const json& j, M& out, const std::string& field) {
  out = M();
  if (j.is_null()) return;
  if (!j.is_object()) wrong_type(field, "a map", j);
  each_field(out, [&](const char* name, auto& member) {
    auto it = j.find(name);
    if (it != j.end()) from_doc(*it, member, field + "." + name);
  });
}

// SAX handler building the document, refusing nesting deeper than kMaxNesting (nlohmann's CBOR
// reader recurses once per level: without a bound, a frame of 0x81 bytes overflows the stack).
// The sizes announced by the input are never used to reserve memory.
class BoundedDocument {
 public:
  explicit BoundedDocument(json& root) : root_(root) {}

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t& v) {
    return put(json::binary(std::move(static_cast<json::binary_t::container_type&>(v))));
  }
  bool start_object(std::size_t) { return open(json::object()); }
  bool key(json::string_t& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    error_ = e.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  json* place(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& container) {
    if (open_.size() >= kMaxNesting) {
      error_ = "nested deeper than " + std::to_string(kMaxNesting) + " levels";
      return false;
    }
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  json& root_;
  std::vector<json*> open_;  // the containers being filled, outermost first
  std::string key_;
  std::string error_;
};

// Parses CBOR or JSON text into a document; throws SchemaError with the parser's reason.
json parse_document(const char* data, size_t n, json::input_format_t format) {
  json doc;
  BoundedDocument sax(doc);
  bool ok = false;
  try {
    ok = json::sax_parse(data, data + n, &sax, format, /*strict=*/true);
  } catch (const json::exception& e) {
    throw SchemaError(e.what());
  }
  if (!ok) throw SchemaError(sax.error().empty() ? "unparsable" : sax.error());
  return doc;
}

// Parses `data` into `msg`; returns why it does not fit the schema (msg then at its defaults), or
// "" when it does.
template <class Msg>
std::string parse_into(const char* data, size_t n, Msg& msg, json::input_format_t format) {
  std::string problem;
  try {
    const json doc = parse_document(data, n, format);
    from_doc(doc, msg, type_name<Msg>());
  } catch (const SchemaError& e) {
    problem = e.what();
  } catch (const json::exception& e) {  // a type error the checks above did not foresee
    problem = e.what();
  }
  if (!problem.empty()) msg = Msg();  // never half filled
  return problem;
}

template <class Msg>
void decode(const char* data, size_t n, Msg& msg, json::input_format_t format, const std::string& what,
            const char* failure) {
  const std::string problem = parse_into(data, n, msg, format);
  if (!problem.empty()) {
    throw WireError(what + ": " + failure + " " + type_name<Msg>() + " (" + std::to_string(n) + " bytes): " + problem);
  }
  check_version(msg.version, (what + ": " + type_name<Msg>()).c_str());
}

// ---- bytes on fds --------------------------------------------------------------------------

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
    throw WireError(std::string(what) + ": frame of " + std::to_string(len) + " bytes exceeds the bound of " +
                    std::to_string(max_bytes) + " bytes");
  }
}

}  // namespace

void check_version(uint32_t version, const char* what) {
  if (version > kSchemaVersion) {
    throw WireError(std::string(what) + ": message schema version " + std::to_string(version) +
                    " is newer than this build's " + std::to_string(kSchemaVersion));
  }
}

template <class Msg>
std::string encode_frame(const Msg& msg) {
  std::string out(4, '\0');
  json::to_cbor(to_doc(msg), out);  // appends
  const size_t body = out.size() - 4;
  if (body > UINT32_MAX) throw WireError(std::string("message too large: ") + type_name<Msg>());
  const auto len = static_cast<uint32_t>(body);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out;
}

template <class Msg>
void write_frame(int fd, const Msg& msg, const char* what) {
  const std::string frame = encode_frame(msg);
  write_all(fd, frame.data(), frame.size(), what);
}

template <class Msg>
void read_frame(int fd, Msg& msg, const char* what, uint32_t max_bytes) {
  unsigned char hdr[4];
  const size_t h = read_all(fd, reinterpret_cast<char*>(hdr), 4, what);
  if (h == 0) throw EndOfStream(std::string(what) + ": end of stream");
  if (h < 4) throw WireError(std::string(what) + ": truncated frame header");
  const uint32_t len = decode_len(hdr);
  check_len(len, max_bytes, what);
  std::string body(len, '\0');
  if (read_all(fd, body.data(), len, what) < len) {
    throw WireError(std::string(what) + ": truncated frame (expected " + std::to_string(len) + " bytes)");
  }
  decode(body.data(), len, msg, json::input_format_t::cbor, what, "malformed");
}

template <class Msg>
bool try_decode_frame(std::string& buf, Msg& msg, const char* what, uint32_t max_bytes) {
  if (buf.size() < 4) return false;
  const uint32_t len = decode_len(reinterpret_cast<const unsigned char*>(buf.data()));
  check_len(len, max_bytes, what);
  if (buf.size() < 4 + size_t(len)) return false;
  decode(buf.data() + 4, len, msg, json::input_format_t::cbor, what, "malformed");
  buf.erase(0, 4 + size_t(len));
  return true;
}

#define LSPAWN_WIRE_INSTANTIATE(Msg)                               \
  template std::string encode_frame<Msg>(const Msg&);              \
  template void write_frame<Msg>(int, const Msg&, const char*);    \
  template void read_frame<Msg>(int, Msg&, const char*, uint32_t); \
  template bool try_decode_frame<Msg>(std::string&, Msg&, const char*, uint32_t);
LSPAWN_WIRE_INSTANTIATE(proto::ErrorReport)
LSPAWN_WIRE_INSTANTIATE(proto::SpawnCall)
LSPAWN_WIRE_INSTANTIATE(proto::SpawnResult)
LSPAWN_WIRE_INSTANTIATE(proto::ForkRequest)
LSPAWN_WIRE_INSTANTIATE(proto::ForkReply)
LSPAWN_WIRE_INSTANTIATE(proto::DaemonRequest)
LSPAWN_WIRE_INSTANTIATE(proto::DaemonReply)
LSPAWN_WIRE_INSTANTIATE(proto::ChildExit)
#undef LSPAWN_WIRE_INSTANTIATE

// ---- the control channel's frames and bodies (node_wire.hpp) ----------------------------------

namespace {

// A CBOR head (RFC 8949 §3): major type and argument, the argument in as few bytes as it takes.
void append_cbor_head(std::string& out, unsigned major, uint64_t n) {
  const auto head = [&](unsigned info, int bytes) {
    out.push_back(static_cast<char>(major << 5 | info));
    for (int s = 8 * (bytes - 1); s >= 0; s -= 8) out.push_back(static_cast<char>((n >> s) & 0xff));
  };
  if (n < 24)
    head(static_cast<unsigned>(n), 0);
  else if (n <= 0xff)
    head(24, 1);
  else if (n <= 0xffff)
    head(25, 2);
  else if (n <= 0xffffffffu)
    head(26, 4);
  else
    head(27, 8);
}

constexpr unsigned kCborText = 3;
constexpr unsigned kCborMap = 5;

void append_cbor_text(std::string& out, const std::string& text) {
  append_cbor_head(out, kCborText, text.size());
  out += text;
}

// The bytes of a CBOR head that starts with `first` (a definite length).
size_t cbor_head_size(uint8_t first) {
  const unsigned info = first & 0x1f;
  return info < 24 ? 1 : 1 + (size_t{1} << (info - 24));
}

}  // namespace

template <class Msg>
std::string encode_node_body(const Msg& msg) {
  static_assert(proto::schema::kIsNodeMessage<Msg>, "not a body of proto/node_messages.hpp");
  std::string out;
  json::to_cbor(to_doc(msg), out);
  return out;
}

template <class Msg>
void decode_node_body(const std::string& cbor, Msg& msg) {
  static_assert(proto::schema::kIsNodeMessage<Msg>, "not a body of proto/node_messages.hpp");
  const std::string problem = parse_into(cbor.data(), cbor.size(), msg, json::input_format_t::cbor);
  if (!problem.empty()) {
    throw WireError(std::string("malformed ") + type_name<Msg>() + " (" + std::to_string(cbor.size()) +
                    " bytes): " + problem);
  }
}

std::string encode_node_frame(const std::string& type, const std::string& body, uint32_t max_bytes) {
  // {"t": type, "m": body}: a map of two, the body's CBOR as it is.
  std::string out(4, '\0');
  out.reserve(4 + 16 + type.size() + body.size());
  append_cbor_head(out, kCborMap, 2);
  append_cbor_text(out, "t");
  append_cbor_text(out, type);
  append_cbor_text(out, "m");
  if (body.empty()) {
    append_cbor_head(out, kCborMap, 0);
  } else {
    out += body;
  }
  const size_t len = out.size() - 4;
  if (len > max_bytes) {
    throw WireError("message '" + type + "' of " + std::to_string(len) + " bytes exceeds the frame limit of " +
                    std::to_string(max_bytes));
  }
  for (int k = 0; k < 4; ++k) out[k] = static_cast<char>((len >> (8 * (3 - k))) & 0xff);
  return out;
}

size_t decode_node_frame(const char* data, size_t n, NodeFrame& frame, uint32_t max_bytes) {
  if (n < 4) return 0;
  uint32_t len = 0;
  for (int k = 0; k < 4; ++k) len = (len << 8) | static_cast<uint8_t>(data[k]);
  if (len > max_bytes) {
    throw WireError("length " + std::to_string(len) + " exceeds " + std::to_string(max_bytes));
  }
  if (n - 4 < len) return 0;
  const std::string where = "frame of " + std::to_string(len) + " bytes: ";
  json doc;
  try {
    doc = parse_document(data + 4, len, json::input_format_t::cbor);
  } catch (const SchemaError& e) {
    throw WireError(where + e.what());
  }
  if (!doc.is_object()) throw WireError(where + "not a map but " + doc.type_name());
  const auto type = doc.find("t");
  if (type == doc.end() || !type->is_string()) throw WireError(where + "no message type (a text at \"t\")");
  const auto body = doc.find("m");
  if (body == doc.end()) throw WireError(where + "no message body (at \"m\")");
  frame.type = type->get<std::string>();
  frame.body.clear();
  json::to_cbor(*body, frame.body);
  return 4 + size_t{len};
}

AssignEncoder::AssignEncoder(const proto::AssignMsg& common) {
  json j = to_doc(common);
  j.erase("node_rank");
  fields_ = j.size();
  std::string cbor;
  json::to_cbor(j, cbor);
  shared_ = cbor.substr(cbor_head_size(static_cast<uint8_t>(cbor[0])));
}

std::string AssignEncoder::for_node(int node_rank) const {
  std::string out;
  out.reserve(16 + shared_.size());
  append_cbor_head(out, kCborMap, fields_ + 1);
  append_cbor_text(out, "node_rank");
  json::to_cbor(json(node_rank), out);
  out += shared_;
  return out;
}

#define LSPAWN_NODE_WIRE_INSTANTIATE(Msg)                 \
  template std::string encode_node_body<Msg>(const Msg&); \
  template void decode_node_body<Msg>(const std::string&, Msg&);
LSPAWN_NODE_WIRE_INSTANTIATE(proto::JoinMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::JoinedMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::AssignMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::RejectMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::FailedMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::StopMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::DoneMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::BusyMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::StartMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::FinishMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::Heartbeat)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::StatusMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::StackAskMsg)
LSPAWN_NODE_WIRE_INSTANTIATE(proto::StacksMsg)
#undef LSPAWN_NODE_WIRE_INSTANTIATE

namespace {
template <class Msg>
void write_json_file_of(const std::string& path, const Msg& msg) {
  const std::string text = to_doc(msg).dump(2, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace) + "\n";
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw WireError(errno_text("open", tmp.c_str(), errno));
  try {
    write_all(fd, text.data(), text.size(), tmp.c_str());
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
}  // namespace

void write_json_file(const std::string& path, const proto::ErrorReport& msg) { write_json_file_of(path, msg); }
void write_json_file(const std::string& path, const proto::RunResult& msg) { write_json_file_of(path, msg); }

std::string read_bounded_file(const std::string& path, uint32_t max_bytes) {
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
  return data;
}

namespace {
template <class Msg>
void read_json_file_of(const std::string& path, Msg& msg, uint32_t max_bytes) {
  const std::string text = read_bounded_file(path, max_bytes);
  decode(text.data(), text.size(), msg, json::input_format_t::json, path, "not a valid");
}
}  // namespace

void read_json_file(const std::string& path, proto::ErrorReport& msg, uint32_t max_bytes) {
  read_json_file_of(path, msg, max_bytes);
}
void read_json_file(const std::string& path, proto::RunResult& msg, uint32_t max_bytes) {
  read_json_file_of(path, msg, max_bytes);
}

}  // namespace lspawn::wire
