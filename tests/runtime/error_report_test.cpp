#include <chrono>
#include <csignal>
#include <stdexcept>

#include <unistd.h>

#include "proto/wire.hpp"
#include "runtime/error_report.hpp"
#include "support/child.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"
#include "support/wait.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using lspawn::test::ChildProcess;
using lspawn::test::TempDir;

namespace {

lspawn::proto::ErrorReport read_report(const std::string& path) {
  lspawn::proto::ErrorReport r;
  lspawn::wire::read_json_file(path, r);
  return r;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::map<std::string, std::string> env_with_error_file(const std::string& var, const std::string& path) {
  return {{"RANK", "3"}, {"LOCAL_RANK", "1"}, {var, path}};
}

}  // namespace

TEST_CASE("error report: an uncaught exception in run_main writes the JSON report and exits 1", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  const int64_t before = now_us();
  ChildProcess c({LSPAWN_TEST_WORKER, "throw"}, env_with_error_file("TORCHELASTIC_ERROR_FILE", report),
                 dir.file("out"));
  const pid_t pid = c.pid();
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.exited);
  CHECK(st.code == 1);
  CHECK_THAT(c.output(), Contains("[lspawn] rank 3: uncaught std::runtime_error: boom from rank 3"));
  const auto r = read_report(report);
  CHECK(r.version == lspawn::wire::kSchemaVersion);
  CHECK(r.rank == 3);
  CHECK(r.local_rank == 1);
  CHECK(r.pid == pid);
  CHECK_FALSE(r.host.empty());
  CHECK(r.exception_type == "std::runtime_error");
  CHECK(r.message == "boom from rank 3");
  // The throw site, recorded when it was thrown (runtime/throw_trace.hpp), not the catch site.
  CHECK_THAT(r.backtrace, Contains("lspawn_test_throw_runtime_error"));
  CHECK_THAT(r.backtrace, !Contains("caught, not where it was thrown"));
  CHECK(r.timestamp_us >= before);
  CHECK(r.timestamp_us <= now_us());
  // The failure time is the throw, before unwinding and writing: the launcher orders by it.
  CHECK(r.failed_at_us >= before);
  CHECK(r.failed_at_us <= r.timestamp_us);
}

// The launcher's SIGTERM (another rank died of this one's closed sockets) lands while the
// exception unwinds toward run_main: the report is still written, then the SIGTERM acts.
TEST_CASE("error report: a SIGTERM during the unwinding waits for the report, then terminates", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  auto env = env_with_error_file("TORCHELASTIC_ERROR_FILE", report);
  env["LSPAWN_TEST_SYNC_DIR"] = dir.path;
  ChildProcess c({LSPAWN_TEST_WORKER, "throw-slow-unwind"}, env, dir.file("out"));
  REQUIRE(lspawn::test::wait_file(dir.file("unwinding"), 30s));
  REQUIRE(::kill(c.pid(), SIGTERM) == 0);  // pending before "go": it lands during the unwinding
  lspawn::test::touch(dir.file("go"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK_FALSE(st.exited);
  CHECK(st.signal == SIGTERM);
  const auto r = read_report(report);
  CHECK(r.exception_type == "std::runtime_error");
  CHECK(r.message == "boom from rank 3");
  CHECK(r.failed_at_us > 0);
}

TEST_CASE("error report: a SIGTERM outside any unwinding terminates at once, without a report", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  auto env = env_with_error_file("TORCHELASTIC_ERROR_FILE", report);
  env["LSPAWN_TEST_SYNC_DIR"] = dir.path;
  ChildProcess c({LSPAWN_TEST_WORKER, "wait-for-term"}, env, dir.file("out"));
  REQUIRE(lspawn::test::wait_file(dir.file("waiting"), 30s));
  REQUIRE(::kill(c.pid(), SIGTERM) == 0);
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK_FALSE(st.exited);
  CHECK(st.signal == SIGTERM);
  CHECK(::access(report.c_str(), F_OK) != 0);
}

TEST_CASE("error report: LSPAWN_ERROR_FILE is used when TORCHELASTIC_ERROR_FILE is unset", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("lspawn-error.json");
  ChildProcess c({LSPAWN_TEST_WORKER, "throw-custom"}, env_with_error_file("LSPAWN_ERROR_FILE", report),
                 dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  const auto r = read_report(report);
  CHECK(r.exception_type == "lspawn_test::CustomError");  // demangled, namespaced
  CHECK(r.message == "custom failure");
}

TEST_CASE("error report: c10::Error keeps its message apart from its own backtrace", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  ChildProcess c({LSPAWN_TEST_WORKER, "throw-c10"}, env_with_error_file("TORCHELASTIC_ERROR_FILE", report),
                 dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  const auto r = read_report(report);
  CHECK(r.exception_type == "c10::Error");
  CHECK_THAT(r.message, Contains("c10 check failed on purpose"));
  CHECK_THAT(r.message, !Contains("frame #"));
  CHECK_THAT(r.backtrace, Contains("frame #"));
}

TEST_CASE("error report: the terminate handler reports the throw site, then aborts", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  ChildProcess c({LSPAWN_TEST_WORKER, "terminate"}, env_with_error_file("TORCHELASTIC_ERROR_FILE", report),
                 dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK_FALSE(st.exited);
  CHECK(st.signal == SIGABRT);
  CHECK_THAT(c.output(), Contains("[lspawn] rank 3: uncaught std::runtime_error: uncaught in main, rank 3"));
  const auto r = read_report(report);
  CHECK(r.exception_type == "std::runtime_error");
  CHECK(r.message == "uncaught in main, rank 3");
  // The stack was not unwound: the throwing function is in the backtrace.
  CHECK_THAT(r.backtrace, Contains("lspawn_test_throw_uncaught"));
}

TEST_CASE("error report: an exception escaping a thread is reported by the terminate handler", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  ChildProcess c({LSPAWN_TEST_WORKER, "terminate-thread"}, env_with_error_file("TORCHELASTIC_ERROR_FILE", report),
                 dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.signal == SIGABRT);
  const auto r = read_report(report);
  CHECK(r.rank == 3);
  CHECK(r.exception_type == "std::runtime_error");
  CHECK(r.message == "thrown in a thread of rank 3");
  // The thread's stack was unwound to its noexcept frame; the recorded throw site survives.
  CHECK_THAT(r.backtrace, Contains("lspawn_test_throw_in_thread"));
}

TEST_CASE("error report: LSPAWN_THROW_TRACE=0 falls back to the catch site", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("error.json");
  auto env = env_with_error_file("TORCHELASTIC_ERROR_FILE", report);
  env["LSPAWN_THROW_TRACE"] = "0";
  ChildProcess c({LSPAWN_TEST_WORKER, "throw"}, env, dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  const auto r = read_report(report);
  CHECK_THAT(r.backtrace, StartsWith("(stack where the exception was caught, not where it was thrown)"));
  CHECK_THAT(r.backtrace, !Contains("lspawn_test_throw_runtime_error"));
}

TEST_CASE("error report: without an error file only the stderr line is printed", "[error_report]") {
  TempDir dir;
  ChildProcess c({LSPAWN_TEST_WORKER, "throw"}, {{"RANK", "0"}}, dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  CHECK_THAT(c.output(), Contains("[lspawn] rank 0: uncaught std::runtime_error: boom from rank 0"));
}

TEST_CASE("error report: an unwritable error file is reported, the exit code kept", "[error_report]") {
  TempDir dir;
  const std::string report = dir.file("no/such/dir/error.json");
  ChildProcess c({LSPAWN_TEST_WORKER, "throw"}, env_with_error_file("TORCHELASTIC_ERROR_FILE", report),
                 dir.file("out"));
  const auto st = c.wait_or_kill(30s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 1);
  CHECK_THAT(c.output(), Contains("could not write the error report") && Contains("no/such/dir"));
}

TEST_CASE("record: returns fn's result, or 1 after reporting an exception", "[unit][error_report]") {
  CHECK(lspawn::record([] { return 7; }) == 7);
  CHECK(lspawn::record([]() -> int { throw std::logic_error("in-process"); }) == 1);
}

TEST_CASE("make_error_report: fields of an exception_ptr, rank unknown without RANK", "[unit][error_report]") {
  ::unsetenv("RANK");
  ::setenv("LOCAL_RANK", "not-a-number", 1);
  const auto r = lspawn::make_error_report(std::make_exception_ptr(std::out_of_range("idx 9")), "bt");
  ::unsetenv("LOCAL_RANK");
  CHECK(r.rank == -1);
  CHECK(r.local_rank == -1);
  CHECK(r.pid == ::getpid());
  CHECK(r.exception_type == "std::out_of_range");
  CHECK(r.message == "idx 9");
  CHECK(r.backtrace == "bt");
  // Bytes that are not UTF-8 cannot go into a JSON string: they are replaced.
  const auto u = lspawn::make_error_report(std::make_exception_ptr(std::runtime_error("bad \xff\xfe byte é")));
  CHECK(u.message == "bad ?? byte é");
  const auto t = lspawn::make_error_report(std::make_exception_ptr(42));
  CHECK(t.exception_type == "int");
  CHECK(t.message == "(not a std::exception)");
}

TEST_CASE("write_error_report(const std::exception&) writes the dynamic type", "[unit][error_report]") {
  TempDir dir;
  const std::string report = dir.file("direct.json");
  ::setenv("LSPAWN_ERROR_FILE", report.c_str(), 1);
  ::setenv("RANK", "5", 1);
  const std::invalid_argument e("bad arg");
  const std::exception& base = e;
  const std::string written = lspawn::write_error_report(base);
  ::unsetenv("LSPAWN_ERROR_FILE");
  ::unsetenv("RANK");
  CHECK(written == report);
  const auto r = read_report(report);
  CHECK(r.rank == 5);
  CHECK(r.exception_type == "std::invalid_argument");
  CHECK(r.message == "bad arg");
  CHECK(lspawn::current_backtrace().find("#0 ") == 0);
}
