#include "spawn/worker.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <typeinfo>

#include "supervisor/error_file.hpp"
#include "supervisor/worker_failure.hpp"
#include "proto/wire.hpp"

namespace lspawn {
namespace {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string errno_text(const char* call, const std::string& path) {
  return std::string(call) + "(" + path + "): " + std::strerror(errno);
}

}  // namespace

proto::ErrorReport report_current_exception(int index) {
  proto::ErrorReport r;
  r.version = wire::kSchemaVersion;
  r.rank = index;
  r.local_rank = index;
  r.pid = ::getpid();
  r.host = host_name();
  r.timestamp_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  try {
    throw;
  } catch (const std::exception& e) {
    r.exception_type = demangle(typeid(e).name());
    r.message = e.what();
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    r.exception_type = t ? demangle(t->name()) : "unknown exception";
    r.message = "(not derived from std::exception)";
  }
  return r;
}

namespace {

template <class Msg>
void write_frame_file_of(const std::string& path, const Msg& msg) {
  const std::string frame = wire::encode_frame(msg);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw wire::WireError(errno_text("open", tmp));
  size_t done = 0;
  while (done < frame.size()) {
    const ssize_t w = ::write(fd, frame.data() + done, frame.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const std::string err = errno_text("write", tmp);
      ::close(fd);
      throw wire::WireError(err);
    }
    done += static_cast<size_t>(w);
  }
  if (::close(fd) != 0) throw wire::WireError(errno_text("close", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw wire::WireError(errno_text("rename", path));
}

template <class Msg>
void read_frame_file_of(const std::string& path, Msg& msg, uint32_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw wire::WireError(errno_text("open", path));
  try {
    wire::read_frame(fd, msg, path.c_str(), max_bytes);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace

void write_frame_file(const std::string& path, const proto::SpawnCall& msg) { write_frame_file_of(path, msg); }
void write_frame_file(const std::string& path, const proto::SpawnResult& msg) { write_frame_file_of(path, msg); }
void read_frame_file(const std::string& path, proto::SpawnCall& msg, uint32_t max_bytes) {
  read_frame_file_of(path, msg, max_bytes);
}
void read_frame_file(const std::string& path, proto::SpawnResult& msg, uint32_t max_bytes) {
  read_frame_file_of(path, msg, max_bytes);
}

int run_worker(const WorkerBody& body) noexcept {
  TermHold hold;  // a SIGTERM while the exception unwinds waits for the report
  try {
    std::optional<proto::Value> value = body.call();
    if (!body.result_path.empty()) {
      proto::SpawnResult result;
      result.version = wire::kSchemaVersion;
      result.index = body.index;
      result.returned = value.has_value();
      if (value) result.value = std::move(*value);
      write_frame_file(body.result_path, result);
    }
    return 0;
  } catch (...) {
    TermHold::Reporting reporting;  // until the report is on disk (the hold's second case)
    proto::ErrorReport report;
    try {
      report = report_current_exception(body.index);
      report.failed_at_us = throw_time_us(std::current_exception());
    } catch (...) {
      report.exception_type = "unknown exception";
    }
    std::fflush(stdout);
    std::fprintf(stderr, "lspawn: process %d of %d raised %s: %s\n", body.index, body.nprocs,
                 report.exception_type.c_str(), report.message.c_str());
    std::fflush(stderr);
    if (!body.error_file.empty()) {
      try {
        write_error_file(body.error_file, report);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "lspawn: process %d could not write its error report: %s\n", body.index, e.what());
      }
    }
    return 1;
  }
}

}  // namespace lspawn
