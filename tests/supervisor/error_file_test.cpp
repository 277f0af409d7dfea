#include <catch2/catch.hpp>

#include "supervisor/error_file.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"

using lspawn::read_error_file;

namespace {
// A temp dir whose file(name, text) writes the file and returns its path.
struct Dir : lspawn::test::TempDir {
  using TempDir::file;
  std::string file(const std::string& name, const std::string& text) const {
    lspawn::test::write_file(file(name), text);
    return file(name);
  }
};
}  // namespace

TEST_CASE("error file: lspawn's ErrorReport round-trips", "[error_file]") {
  Dir d;
  lspawn::proto::ErrorReport r;
  r.rank = 3;
  r.local_rank = 1;
  r.pid = 777;
  r.host = "h";
  r.exception_type = "std::logic_error";
  r.message = "bad: thing";
  r.backtrace = "a\nb";
  r.timestamp_us = 12;
  lspawn::write_error_file(d.path + "/e.json", r);
  auto got = read_error_file(d.path + "/e.json");
  REQUIRE(got.report);
  CHECK(got.problem.empty());
  CHECK(got.report->version == 1);
  CHECK(got.report->rank == 3);
  CHECK(got.report->pid == 777);
  CHECK(got.report->exception_type == "std::logic_error");
  CHECK(got.report->message == "bad: thing");
  CHECK(got.report->backtrace == "a\nb");
}

TEST_CASE("error file: a report written through protobuf's JSON mapping (earlier lspawn builds) reads",
          "[error_file]") {
  Dir d;
  // int64 fields as JSON strings, as protobuf wrote them.
  auto p = d.file("old.json", R"({
 "version": 1, "rank": 2, "local_rank": 0, "pid": "31337", "host": "n1",
 "exception_type": "std::runtime_error", "message": "old format", "backtrace": "",
 "timestamp_us": "1763768001234567", "failed_at_us": "1763768001234012"
})");
  auto got = read_error_file(p);
  REQUIRE(got.report);
  CHECK(got.problem.empty());
  CHECK(got.report->rank == 2);
  CHECK(got.report->pid == 31337);
  CHECK(got.report->exception_type == "std::runtime_error");
  CHECK(got.report->message == "old format");
  CHECK(got.report->timestamp_us == 1763768001234567);
  CHECK(got.report->failed_at_us == 1763768001234012);
}

TEST_CASE("error file: torchrun's @record format", "[error_file]") {
  Dir d;
  auto p = d.file(
      "t.json",
      R"({"message": {"message": "RuntimeError: CUDA out of memory", "extraInfo": {"py_callstack": "Traceback...\nline", "timestamp": "1700000000"}}})");
  auto got = read_error_file(p);
  REQUIRE(got.report);
  CHECK(got.report->exception_type == "RuntimeError");
  CHECK(got.report->message == "CUDA out of memory");
  CHECK(got.report->backtrace == "Traceback...\nline");
  CHECK(got.report->timestamp_us == 1700000000LL * 1000000);
  CHECK(got.report->rank == -1);

  p = d.file("s.json", R"({"message": "plain text, no type"})");
  got = read_error_file(p);
  REQUIRE(got.report);
  CHECK(got.report->exception_type.empty());
  CHECK(got.report->message == "plain text, no type");
}

TEST_CASE("error file: missing is not a problem - garbage - oversize and newer versions are", "[error_file]") {
  Dir d;
  auto got = read_error_file(d.path + "/absent.json");
  CHECK_FALSE(got.report);
  CHECK(got.problem.empty());

  got = read_error_file(d.file("g.json", "{not json"));
  CHECK_FALSE(got.report);
  CHECK(got.problem.find("g.json") != std::string::npos);

  got = read_error_file(d.file("v.json", R"({"version": 99, "message": "from the future"})"));
  CHECK_FALSE(got.report);
  CHECK(got.problem.find("99") != std::string::npos);

  got = read_error_file(d.file("big.json", "{\"message\": \"" + std::string(2 << 20, 'x') + "\"}"));
  CHECK_FALSE(got.report);
  CHECK(got.problem.find("bound") != std::string::npos);

  got = read_error_file(d.file("arr.json", "[1, 2]"));
  CHECK_FALSE(got.report);
  CHECK_FALSE(got.problem.empty());
}
