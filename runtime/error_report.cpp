#include "runtime/error_report.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <cxxabi.h>
#include <execinfo.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include "proto/wire.hpp"
#include "runtime/throw_trace.hpp"
#include "runtime/torch_compat.hpp"
#include "supervisor/worker_failure.hpp"

namespace lspawn {
namespace {

// Report text goes into JSON, which must be UTF-8: invalid bytes become '?'.
std::string utf8(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 2 && c < 0xc2) ok = false;  // overlong
    if (ok) {
      out.append(in, i, len);
      i += len;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

// -1 when unset or not a plain non-negative integer.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n >= 0 && n <= 1 << 30) ? static_cast<int>(n) : -1;
}

std::string error_file_path() {
  for (const char* name : {"TORCHELASTIC_ERROR_FILE", "LSPAWN_ERROR_FILE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "";
}

std::string rank_text(int rank) { return rank < 0 ? std::string("?") : std::to_string(rank); }

// Prints the one-line summary and writes the file; never throws.
std::string emit(const proto::ErrorReport& report, const char* verb) {
  std::fprintf(stderr, "[lspawn] rank %s: %s %s: %s\n", rank_text(report.rank).c_str(), verb,
               report.exception_type.c_str(), report.message.c_str());
  std::fflush(stderr);
  const std::string path = error_file_path();
  if (path.empty()) return "";
  try {
    wire::write_json_file(path, report);
    return path;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[lspawn] rank %s: could not write the error report: %s\n", rank_text(report.rank).c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "[lspawn] rank %s: could not write the error report to %s\n", rank_text(report.rank).c_str(),
                 path.c_str());
  }
  std::fflush(stderr);
  return "";
}

// A caught exception's stack is gone; the trace we can take is where it was caught.
const std::string kCaughtHere = "(stack where the exception was caught, not where it was thrown)\n";

std::atomic<bool> g_terminating{false};

[[noreturn]] void on_terminate() {
  if (!g_terminating.exchange(true)) {
    if (std::exception_ptr e = std::current_exception()) {
      // The recorded throw site; else this stack, which is the throw site when nothing was
      // unwound (no handler at all) or the noexcept frame that stopped the exception.
      std::string bt = detail::throw_site_backtrace(e);
      if (bt.empty()) bt = current_backtrace(2);
      emit(make_error_report(e, bt), "uncaught");
    } else {
      proto::ErrorReport r = make_error_report(nullptr, current_backtrace(2));
      emit(r, "terminate:");
    }
  }
  std::abort();
}

}  // namespace

std::string current_backtrace(int skip) {
  constexpr int kMaxFrames = 64;
  void* frames[kMaxFrames];
  const int n = ::backtrace(frames, kMaxFrames);
  return detail::symbolize(frames, n, skip + 1);  // +1: this function
}

proto::ErrorReport make_error_report(std::exception_ptr error, const std::string& backtrace) {
  proto::ErrorReport r;
  r.version = wire::kSchemaVersion;
  r.rank = env_int("RANK");
  r.local_rank = env_int("LOCAL_RANK");
  r.pid = ::getpid();
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) r.host = utf8(host);
  r.timestamp_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  r.failed_at_us = detail::throw_site_time_us(error);
  r.backtrace = utf8(backtrace);
  if (!error) {
    r.exception_type = "std::terminate";
    r.message = "std::terminate called without an active exception";
    return r;
  }
  try {
    std::rethrow_exception(error);
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    r.exception_type = t != nullptr ? detail::demangle(t->name()) : "unknown";
    try {
      throw;
    } catch (const c10::Error& e) {
      r.message = utf8(e.what_without_backtrace());
      if (const std::string bt = compat::backtrace_of(e); !bt.empty()) r.backtrace = utf8(bt);
    } catch (const std::exception& e) {
      r.message = utf8(e.what());
    } catch (...) {
      r.message = "(not a std::exception)";
    }
  }
  return r;
}

std::string write_error_report(std::exception_ptr error) {
  try {
    std::string bt = detail::throw_site_backtrace(error);
    if (bt.empty()) bt = kCaughtHere + current_backtrace(1);
    return emit(make_error_report(error, bt), "uncaught");
  } catch (...) {
    return "";
  }
}

std::string write_error_report(const std::exception& error) {
  try {
    // No exception_ptr of the dynamic type can be made from a reference: describe it directly.
    proto::ErrorReport r = make_error_report(nullptr, kCaughtHere + current_backtrace(1));
    r.exception_type = detail::demangle(typeid(error).name());
    if (auto* c = dynamic_cast<const c10::Error*>(&error)) {
      r.message = utf8(c->what_without_backtrace());
      if (const std::string bt = compat::backtrace_of(*c); !bt.empty()) r.backtrace = utf8(bt);
    } else {
      r.message = utf8(error.what());
    }
    return emit(r, "uncaught");
  } catch (...) {
    return "";
  }
}

std::terminate_handler install_error_handler() { return std::set_terminate(on_terminate); }

int record(const std::function<int()>& fn) {
  TermHold hold;  // a SIGTERM while the exception unwinds waits for the report
  try {
    return fn();
  } catch (...) {
    TermHold::Reporting reporting;  // until the report is on disk (the hold's second case)
    write_error_report(std::current_exception());
    return 1;
  }
}

int run_main(int argc, char** argv, int (*main_fn)(int, char**)) {
  install_error_handler();
  return record([&] { return main_fn(argc, argv); });
}

}  // namespace lspawn
