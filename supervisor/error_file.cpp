#include "supervisor/error_file.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "proto/wire.hpp"

namespace lspawn {
namespace {

constexpr uint32_t kMaxErrorFile = 1u << 20;  // as error_file.hpp says

// "RuntimeError", "torch.distributed.DistBackendError", "std::runtime_error".
bool looks_like_type_name(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' || c == '<' || c == '>')) {
      return false;
    }
  }
  return true;
}

using json = nlohmann::json;

void split_type_and_message(const std::string& text, proto::ErrorReport& r) {
  const auto colon = text.find(": ");
  if (colon != std::string::npos && looks_like_type_name(text.substr(0, colon))) {
    r.exception_type = text.substr(0, colon);
    r.message = text.substr(colon + 2);
  } else {
    r.message = text;
  }
}

// The string member `key` of object `j`, or nullptr.
const std::string* string_member(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
}

// Returns true when `doc` (an object) is torchrun's format and fills r.
bool from_torchrun(const json& doc, proto::ErrorReport& r) {
  auto it = doc.find("message");
  if (it == doc.end()) return false;
  const json& m = *it;
  r.rank = -1;
  r.local_rank = -1;
  if (m.is_string()) {
    split_type_and_message(m.get_ref<const std::string&>(), r);
    return true;
  }
  if (!m.is_object()) return false;
  if (const std::string* text = string_member(m, "message")) split_type_and_message(*text, r);
  if (auto ei = m.find("extraInfo"); ei != m.end() && ei->is_object()) {
    if (const std::string* cs = string_member(*ei, "py_callstack")) r.backtrace = *cs;
    if (const std::string* ts = string_member(*ei, "timestamp")) {
      r.timestamp_us = std::strtoll(ts->c_str(), nullptr, 10) * 1000000;
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
    // nlohmann's JSON parser is iterative: a deeply nested file cannot exhaust the stack.
    const json doc = json::parse(wire::read_bounded_file(path, kMaxErrorFile), nullptr,
                                 /*allow_exceptions=*/false);
    if (doc.is_discarded()) throw wire::WireError(path + ": not valid JSON");
    proto::ErrorReport r;
    // lspawn's own format has "exception_type" / "message" as strings at top level; torchrun's
    // has "message" as an object.
    if (doc.is_object()) {
      const bool torchrun_like =
          !doc.contains("exception_type") && doc.contains("message") && doc["message"].is_object();
      if (torchrun_like || (doc.contains("message") && doc.size() == 1)) {
        if (from_torchrun(doc, r)) {
          out.report = std::move(r);
          return out;
        }
      }
    }
    wire::read_json_file(path, r, kMaxErrorFile);
    out.report = std::move(r);
  } catch (const std::exception& e) {
    out.problem = e.what();
  }
  return out;
}

void write_error_file(const std::string& path, proto::ErrorReport report) {
  report.version = wire::kSchemaVersion;
  wire::write_json_file(path, report);
}

}  // namespace lspawn
