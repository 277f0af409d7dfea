#include "launcher/error_file.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sys/stat.h>

#include <google/protobuf/struct.pb.h>

#include "proto/wire.hpp"

namespace lspawn {
namespace {

// "RuntimeError", "torch.distributed.DistBackendError", "std::runtime_error".
bool looks_like_type_name(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' ||
          c == '<' || c == '>')) {
      return false;
    }
  }
  return true;
}

void split_type_and_message(const std::string& text, proto::ErrorReport& r) {
  const auto colon = text.find(": ");
  if (colon != std::string::npos && looks_like_type_name(text.substr(0, colon))) {
    r.set_exception_type(text.substr(0, colon));
    r.set_message(text.substr(colon + 2));
  } else {
    r.set_message(text);
  }
}

// Returns true when `s` is torchrun's format and fills r.
bool from_torchrun(const google::protobuf::Struct& s, proto::ErrorReport& r) {
  auto it = s.fields().find("message");
  if (it == s.fields().end()) return false;
  const auto& m = it->second;
  r.set_rank(-1);
  r.set_local_rank(-1);
  if (m.kind_case() == google::protobuf::Value::kStringValue) {
    split_type_and_message(m.string_value(), r);
    return true;
  }
  if (m.kind_case() != google::protobuf::Value::kStructValue) return false;
  const auto& inner = m.struct_value().fields();
  if (auto mm = inner.find("message");
      mm != inner.end() && mm->second.kind_case() == google::protobuf::Value::kStringValue) {
    split_type_and_message(mm->second.string_value(), r);
  }
  if (auto ei = inner.find("extraInfo");
      ei != inner.end() && ei->second.kind_case() == google::protobuf::Value::kStructValue) {
    const auto& extra = ei->second.struct_value().fields();
    if (auto cs = extra.find("py_callstack");
        cs != extra.end() && cs->second.kind_case() == google::protobuf::Value::kStringValue) {
      r.set_backtrace(cs->second.string_value());
    }
    if (auto ts = extra.find("timestamp");
        ts != extra.end() && ts->second.kind_case() == google::protobuf::Value::kStringValue) {
      r.set_timestamp_us(std::strtoll(ts->second.string_value().c_str(), nullptr, 10) * 1000000);
    }
  }
  return true;
}

}  // namespace

ErrorFileResult read_error_file(const std::string& path) {
  ErrorFileResult out;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) out.problem = "cannot stat error file " + path + ": " + strerror(errno);
    return out;
  }
  try {
    google::protobuf::Struct s;
    wire::read_json_file(path, s);
    proto::ErrorReport r;
    // lspawn's own format has "exception_type" / "message" as strings at top level; torchrun's
    // has "message" as an object.
    const auto& f = s.fields();
    const bool torchrun_like =
        f.count("exception_type") == 0 && f.count("exceptionType") == 0 && f.count("message") &&
        f.at("message").kind_case() == google::protobuf::Value::kStructValue;
    if (torchrun_like || (f.count("message") && f.size() == 1)) {
      if (from_torchrun(s, r)) {
        out.report = std::move(r);
        return out;
      }
    }
    wire::read_json_file(path, r);
    wire::check_version(r.version(), ("error file " + path).c_str());
    out.report = std::move(r);
  } catch (const std::exception& e) {
    out.problem = e.what();
  }
  return out;
}

void write_error_file(const std::string& path, proto::ErrorReport report) {
  report.set_version(wire::kSchemaVersion);
  wire::write_json_file(path, report);
}

}  // namespace lspawn
