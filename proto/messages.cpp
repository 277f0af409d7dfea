#include "proto/messages.hpp"
#include "proto/node_messages.hpp"

#include <tuple>
#include <utility>

namespace lspawn::proto {

namespace {
Value with_kind(Value::Kind kind) {
  Value v;
  v.kind = kind;
  return v;
}
}  // namespace

Value Value::of_int(int64_t x) {
  Value v = with_kind(Kind::kInt);
  v.i = x;
  return v;
}

Value Value::of_double(double x) {
  Value v = with_kind(Kind::kDouble);
  v.f = x;
  return v;
}

Value Value::of_bool(bool x) {
  Value v = with_kind(Kind::kBool);
  v.b = x;
  return v;
}

Value Value::of_string(std::string x) {
  Value v = with_kind(Kind::kString);
  v.s = std::move(x);
  return v;
}

Value Value::of_tensor(std::string bytes) {
  Value v = with_kind(Kind::kTensor);
  v.s = std::move(bytes);
  return v;
}

Value Value::of_blob(std::string bytes) {
  Value v = with_kind(Kind::kBlob);
  v.s = std::move(bytes);
  return v;
}

Value Value::of_list(ValueList items) {
  Value v = with_kind(Kind::kList);
  v.list = std::move(items);
  return v;
}

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNone: return "nothing";
    case Value::Kind::kInt: return "int64";
    case Value::Kind::kDouble: return "double";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kString: return "string";
    case Value::Kind::kTensor: return "tensor";
    case Value::Kind::kList: return "list";
    case Value::Kind::kBlob: return "blob";
  }
  return "an unknown kind";
}

bool operator==(const ErrorReport& a, const ErrorReport& b) {
  auto t = [](const ErrorReport& r) {
    return std::tie(r.version, r.rank, r.local_rank, r.pid, r.host, r.exception_type, r.message, r.backtrace,
                    r.timestamp_us, r.failed_at_us);
  };
  return t(a) == t(b);
}

bool operator==(const Value& a, const Value& b) {
  auto t = [](const Value& v) { return std::tie(v.kind, v.i, v.f, v.b, v.s, v.list); };
  return t(a) == t(b);
}

bool operator==(const SpawnCall& a, const SpawnCall& b) {
  auto t = [](const SpawnCall& c) {
    return std::tie(c.version, c.function, c.index, c.nprocs, c.args, c.want_result, c.result_path);
  };
  return t(a) == t(b);
}

bool operator==(const SpawnResult& a, const SpawnResult& b) {
  auto t = [](const SpawnResult& r) { return std::tie(r.version, r.index, r.value, r.returned); };
  return t(a) == t(b);
}

bool operator==(const ForkRequest& a, const ForkRequest& b) {
  auto t = [](const ForkRequest& r) {
    return std::tie(r.version, r.index, r.shutdown, r.call, r.env, r.has_stdio, r.server, r.cwd, r.umask);
  };
  return t(a) == t(b);
}

bool operator==(const ForkReply& a, const ForkReply& b) {
  auto t = [](const ForkReply& r) { return std::tie(r.version, r.index, r.pid, r.error); };
  return t(a) == t(b);
}

bool operator==(const ChildExit& a, const ChildExit& b) {
  auto t = [](const ChildExit& e) { return std::tie(e.version, e.index, e.pid, e.exit_code, e.signal); };
  return t(a) == t(b);
}

bool operator==(const DaemonRequest& a, const DaemonRequest& b) {
  auto t = [](const DaemonRequest& r) { return std::tie(r.version, r.op, r.path, r.argv, r.env); };
  return t(a) == t(b);
}

bool operator==(const DaemonReply& a, const DaemonReply& b) {
  auto t = [](const DaemonReply& r) {
    return std::tie(r.version, r.error, r.daemon_pid, r.forkserver_pid, r.server_pid, r.reused, r.runs, r.forkservers);
  };
  return t(a) == t(b);
}

namespace {
struct CauseKindName {
  CauseKind kind;
  const char* name;
};
constexpr CauseKindName kCauseKinds[] = {{CauseKind::Worker, "worker"},
                                         {CauseKind::NodeLost, "node-lost"},
                                         {CauseKind::Signal, "signal"},
                                         {CauseKind::Hang, "hang"},
                                         {CauseKind::Membership, "membership"}};
}  // namespace

const char* cause_kind_name(CauseKind k) {
  for (const auto& c : kCauseKinds)
    if (c.kind == k) return c.name;
  return "?";
}

std::optional<CauseKind> parse_cause_kind(const std::string& name) {
  for (const auto& c : kCauseKinds)
    if (name == c.name) return c.kind;
  return std::nullopt;
}

}  // namespace lspawn::proto
