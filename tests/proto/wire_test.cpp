#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>

#include "proto/lspawn.pb.h"
#include "proto/wire.hpp"

#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
using lspawn::proto::ErrorReport;
using lspawn::proto::ForkReply;
using lspawn::wire::EndOfStream;
using lspawn::wire::WireError;

namespace {

// A pipe whose ends close on destruction.
struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    close_write();
  }
  void close_write() {
    if (w >= 0) ::close(w);
    w = -1;
  }
  void put(const std::string& bytes) {
    REQUIRE(::write(w, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
};

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/lspawn-proto-test.XXXXXX";
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    ::nftw(path.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 8,
           FTW_DEPTH | FTW_PHYS);
  }
};

std::string le32(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

ErrorReport sample_report() {
  ErrorReport r;
  r.set_version(lspawn::wire::kSchemaVersion);
  r.set_rank(3);
  r.set_local_rank(1);
  r.set_pid(4242);
  r.set_host("node-a");
  r.set_exception_type("std::runtime_error");
  r.set_message("boom \"quoted\" \n newline");
  r.set_backtrace("#0 a\n#1 b\n");
  r.set_timestamp_us(1700000000123456);
  return r;
}

bool same(const ErrorReport& a, const ErrorReport& b) { return a.SerializeAsString() == b.SerializeAsString(); }

void write_file(const std::string& path, const std::string& content) {
  FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  std::fwrite(content.data(), 1, content.size(), f);
  std::fclose(f);
}

}  // namespace

TEST_CASE("wire: frames round-trip through a pipe", "[wire]") {
  Pipe p;
  const ErrorReport a = sample_report();
  ForkReply b;
  b.set_version(1);
  b.set_index(7);
  b.set_pid(99);
  lspawn::wire::write_frame(p.w, a, "test pipe");
  lspawn::wire::write_frame(p.w, b, "test pipe");
  p.close_write();
  ErrorReport a2;
  ForkReply b2;
  lspawn::wire::read_frame(p.r, a2, "test pipe");
  lspawn::wire::read_frame(p.r, b2, "test pipe");
  CHECK(same(a, a2));
  CHECK(b2.index() == 7);
  CHECK(b2.pid() == 99);
  // Clean end of stream between frames is EndOfStream, a subclass of WireError.
  CHECK_THROWS_AS(lspawn::wire::read_frame(p.r, a2, "test pipe"), EndOfStream);
}

TEST_CASE("wire: an empty message is a 4-byte frame", "[wire]") {
  ForkReply empty;
  const std::string f = lspawn::wire::encode_frame(empty);
  CHECK(f == le32(0));
  std::string buf = f;
  ForkReply out;
  CHECK(lspawn::wire::try_decode_frame(buf, out, "mem"));
  CHECK(buf.empty());
}

TEST_CASE("wire: an oversize length is rejected before reading or allocating", "[wire]") {
  Pipe p;
  p.put(le32(0xFFFFFFFFu));  // 4 GiB announced, nothing follows
  ErrorReport r;
  CHECK_THROWS_WITH(lspawn::wire::read_frame(p.r, r, "rank 2 pipe", 1024),
                    Contains("rank 2 pipe") && Contains("4294967295 bytes exceeds the bound of 1024 bytes"));
  std::string buf = le32(2048) + std::string(10, 'x');
  CHECK_THROWS_AS(lspawn::wire::try_decode_frame(buf, r, "mem", 1024), WireError);
  // Exactly at the bound is accepted.
  const std::string body = sample_report().SerializeAsString();
  std::string ok = le32(static_cast<uint32_t>(body.size())) + body;
  CHECK(lspawn::wire::try_decode_frame(ok, r, "mem", static_cast<uint32_t>(body.size())));
}

TEST_CASE("wire: truncated header and truncated body are errors", "[wire]") {
  ErrorReport r;
  {
    Pipe p;
    p.put(std::string("\x05\x00", 2));
    p.close_write();
    CHECK_THROWS_WITH(lspawn::wire::read_frame(p.r, r, "hdr"), Contains("hdr: truncated frame header"));
  }
  {
    Pipe p;
    const std::string frame = lspawn::wire::encode_frame(sample_report());
    p.put(frame.substr(0, frame.size() - 3));
    p.close_write();
    CHECK_THROWS_WITH(lspawn::wire::read_frame(p.r, r, "body"), Contains("body: truncated frame (expected"));
  }
  // In memory a partial frame is not an error: the reader waits for more bytes.
  std::string buf = lspawn::wire::encode_frame(sample_report());
  const std::string rest = buf.substr(buf.size() / 2);
  buf.resize(buf.size() / 2);
  CHECK_FALSE(lspawn::wire::try_decode_frame(buf, r, "mem"));
  buf += rest;
  CHECK(lspawn::wire::try_decode_frame(buf, r, "mem"));
  CHECK(same(r, sample_report()));
}

TEST_CASE("wire: garbage bytes are a WireError naming the message type", "[wire]") {
  // Field 0 / wire type 7 is invalid in every message.
  const std::string garbage = "\xff\xff\xff\xff\x0f\x07";
  std::string buf = le32(static_cast<uint32_t>(garbage.size())) + garbage;
  ErrorReport r;
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, r, "garbage"),
                    Contains("garbage: malformed lspawn.proto.ErrorReport"));
}

TEST_CASE("wire: random input never crashes the decoder", "[wire]") {
  std::mt19937 rng(12345);
  int parsed = 0, rejected = 0, partial = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string buf(rng() % 64, '\0');
    for (auto& c : buf) c = static_cast<char>(rng());
    if (buf.size() >= 4 && (i % 2 == 0)) {  // half with a plausible small length
      const std::string l = le32(static_cast<uint32_t>(buf.size() - 4));
      buf.replace(0, 4, l);
    }
    ErrorReport r;
    try {
      if (lspawn::wire::try_decode_frame(buf, r, "fuzz", 1 << 16)) ++parsed; else ++partial;
    } catch (const WireError&) {
      ++rejected;
    }
  }
  CHECK(parsed + rejected + partial == 2000);
  CHECK(rejected > 0);
}

TEST_CASE("wire: a newer schema version is rejected naming both versions", "[wire]") {
  CHECK_NOTHROW(lspawn::wire::check_version(lspawn::wire::kSchemaVersion, "ErrorReport"));
  CHECK_NOTHROW(lspawn::wire::check_version(0, "ErrorReport"));  // older (or unset): accepted
  const uint32_t newer = lspawn::wire::kSchemaVersion + 1;
  CHECK_THROWS_WITH(lspawn::wire::check_version(newer, "ErrorReport"),
                    Contains("schema version " + std::to_string(newer)) &&
                        Contains("newer than this build's " + std::to_string(lspawn::wire::kSchemaVersion)));
  // Reading a frame of a newer version fails, as wire.hpp promises.
  ErrorReport future = sample_report();
  future.set_version(newer);
  Pipe p;
  lspawn::wire::write_frame(p.w, future, "pipe");
  ErrorReport r;
  CHECK_THROWS_WITH(lspawn::wire::read_frame(p.r, r, "pipe"), Contains("newer than this build's"));
  std::string buf = lspawn::wire::encode_frame(future);
  CHECK_THROWS_AS(lspawn::wire::try_decode_frame(buf, r, "mem"), WireError);
}

TEST_CASE("wire: JSON files round-trip with proto field names, atomically", "[wire][json]") {
  TempDir dir;
  const std::string path = dir.path + "/error.json";
  lspawn::wire::write_json_file(path, sample_report());
  ErrorReport back;
  lspawn::wire::read_json_file(path, back);
  CHECK(same(back, sample_report()));
  FILE* f = std::fopen(path.c_str(), "r");
  REQUIRE(f != nullptr);
  char text[4096] = {};
  std::fread(text, 1, sizeof text - 1, f);
  std::fclose(f);
  CHECK_THAT(std::string(text), Contains("\"exception_type\": \"std::runtime_error\""));
  CHECK_THAT(std::string(text), Contains("\"local_rank\": 1"));
  // The temp file was renamed over the report: nothing else remains.
  CHECK(::access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK) != 0);
}

TEST_CASE("wire: bad JSON files are errors naming the path", "[wire][json]") {
  TempDir dir;
  ErrorReport r;
  const std::string missing = dir.path + "/missing.json";
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(missing, r), Contains("open (" + missing + ")"));
  const std::string garbage = dir.path + "/garbage.json";
  write_file(garbage, "{\"rank\": \"not a number\"");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(garbage, r),
                    Contains(garbage) && Contains("not a valid lspawn.proto.ErrorReport"));
  const std::string big = dir.path + "/big.json";
  write_file(big, "{\"message\": \"" + std::string(5000, 'x') + "\"}");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(big, r, 1000), Contains("larger than the bound of 1000 bytes"));
  // Unknown fields (a newer writer) are ignored; a newer version is not.
  const std::string unknown = dir.path + "/unknown.json";
  write_file(unknown, "{\"version\": 1, \"rank\": 2, \"future_field\": true}");
  CHECK_NOTHROW(lspawn::wire::read_json_file(unknown, r));
  CHECK(r.rank() == 2);
  const std::string newer = dir.path + "/newer.json";
  write_file(newer, "{\"version\": " + std::to_string(lspawn::wire::kSchemaVersion + 1) + ", \"rank\": 2}");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(newer, r), Contains("newer than this build's"));
  const std::string unwritable = dir.path + "/no/such/dir/x.json";
  CHECK_THROWS_WITH(lspawn::wire::write_json_file(unwritable, sample_report()), Contains(unwritable));
}
