#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"

#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
using lspawn::proto::ChildExit;
using lspawn::proto::ErrorReport;
using lspawn::proto::ForkReply;
using lspawn::proto::ForkRequest;
using lspawn::proto::SpawnCall;
using lspawn::proto::SpawnResult;
using lspawn::proto::Value;
using lspawn::test::TempDir;
using lspawn::test::write_file;
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

std::string le32(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

ErrorReport sample_report() {
  ErrorReport r;
  r.version = lspawn::wire::kSchemaVersion;
  r.rank = 3;
  r.local_rank = 1;
  r.pid = 4242;
  r.host = "node-a";
  r.exception_type = "std::runtime_error";
  r.message = "boom \"quoted\" \n newline";
  r.backtrace = "#0 a\n#1 b\n";
  r.timestamp_us = 1700000000123456;
  r.failed_at_us = 1700000000123000;
  return r;
}

// A Value of every kind, nested.
Value sample_value() {
  return Value::of_list({Value::of_int(-7), Value::of_int(INT64_MIN), Value::of_double(2.5), Value::of_bool(true),
                         Value::of_string("text"), Value::of_tensor(std::string("\0\x01\xff tensor", 10)),
                         Value::of_blob(std::string("\0blob", 5)), Value(),
                         Value::of_list({Value::of_list({}), Value::of_string("")})});
}

SpawnCall sample_call() {
  SpawnCall c;
  c.version = lspawn::wire::kSchemaVersion;
  c.function = "train";
  c.index = 2;
  c.nprocs = 4;
  c.args = {sample_value(), Value::of_int(1)};
  c.want_result = true;
  c.result_path = "/tmp/x/result.2";
  return c;
}

// A frame holding `doc` (crafted by hand, as another writer would) as CBOR.
std::string cbor_frame(const nlohmann::json& doc) {
  std::string body;
  nlohmann::json::to_cbor(doc, body);
  return le32(static_cast<uint32_t>(body.size())) + body;
}

template <class Msg>
Msg round_trip(const Msg& m) {
  std::string buf = lspawn::wire::encode_frame(m);
  Msg out;
  REQUIRE(lspawn::wire::try_decode_frame(buf, out, "mem"));
  CHECK(buf.empty());
  return out;
}

}  // namespace

TEST_CASE("wire: frames round-trip through a pipe", "[wire]") {
  Pipe p;
  const ErrorReport a = sample_report();
  ForkReply b;
  b.version = 1;
  b.index = 7;
  b.pid = 99;
  lspawn::wire::write_frame(p.w, a, "test pipe");
  lspawn::wire::write_frame(p.w, b, "test pipe");
  p.close_write();
  ErrorReport a2;
  ForkReply b2;
  lspawn::wire::read_frame(p.r, a2, "test pipe");
  lspawn::wire::read_frame(p.r, b2, "test pipe");
  CHECK(a == a2);
  CHECK(b2 == b);
  // Clean end of stream between frames is EndOfStream, a subclass of WireError.
  CHECK_THROWS_AS(lspawn::wire::read_frame(p.r, a2, "test pipe"), EndOfStream);
}

TEST_CASE("wire: every message round-trips field by field", "[wire]") {
  CHECK(round_trip(sample_report()) == sample_report());
  CHECK(round_trip(sample_call()) == sample_call());

  SpawnResult res;
  res.version = 1;
  res.index = 3;
  res.value = sample_value();
  res.returned = true;
  CHECK(round_trip(res) == res);

  ForkRequest req;
  req.version = 1;
  req.index = 2;
  req.call = sample_call();
  req.env = {"RANK=2", "A=b=c", std::string("BYTES=\xff\xfe", 8)};  // env values need not be UTF-8
  req.has_stdio = true;
  CHECK(round_trip(req) == req);
  ForkRequest server;  // a per-run server of the warm daemon, with a worker directory and umask
  server.version = 1;
  server.index = -1;
  server.server = true;
  server.cwd = "/home/u/run";
  server.umask = 027;
  CHECK(round_trip(server) == server);
  CHECK(round_trip(ForkRequest()).umask == -1);
  ForkRequest stop;
  stop.version = 1;
  stop.shutdown = true;
  CHECK(round_trip(stop) == stop);

  ForkReply rep;
  rep.version = 1;
  rep.index = -1;
  rep.pid = 0;
  rep.error = "fork: Resource temporarily unavailable";
  CHECK(round_trip(rep) == rep);

  ChildExit e;
  e.version = 1;
  e.index = 5;
  e.pid = 123456;
  e.exit_code = 0;
  e.signal = 9;
  CHECK(round_trip(e) == e);

  lspawn::proto::DaemonRequest dq;
  dq.version = 1;
  dq.op = "forkserver";
  dq.path = "/opt/prog";
  dq.argv = {"prog", "--lr", "0.1"};
  dq.env = {"OMP_NUM_THREADS=1", "PATH=/usr/bin"};
  CHECK(round_trip(dq) == dq);
  lspawn::proto::DaemonReply dr;
  dr.version = 1;
  dr.daemon_pid = 10;
  dr.forkserver_pid = 11;
  dr.server_pid = 12;
  dr.reused = true;
  dr.runs = 7;
  dr.forkservers = {"forkserver pid 11, runs 7"};
  CHECK(round_trip(dr) == dr);
  dr.error = "refused";
  CHECK(round_trip(dr) == dr);

  // Defaults survive too (an empty message is a map of defaults, not an empty frame).
  CHECK(round_trip(ForkReply()) == ForkReply());
  CHECK(round_trip(SpawnResult()).value.kind == Value::Kind::kNone);
}

TEST_CASE("wire: values keep their kind - tensor and blob bytes stay apart", "[wire]") {
  SpawnResult r;
  r.value = sample_value();
  const SpawnResult back = round_trip(r);
  REQUIRE(back.value.kind == Value::Kind::kList);
  REQUIRE(back.value.list.size() == 9);
  CHECK(back.value.list[0].kind == Value::Kind::kInt);
  CHECK(back.value.list[1].i == INT64_MIN);
  CHECK(back.value.list[2].kind == Value::Kind::kDouble);
  CHECK(back.value.list[2].f == 2.5);
  CHECK(back.value.list[3].kind == Value::Kind::kBool);
  CHECK(back.value.list[4].kind == Value::Kind::kString);
  CHECK(back.value.list[5].kind == Value::Kind::kTensor);
  CHECK(back.value.list[5].s == std::string("\0\x01\xff tensor", 10));
  CHECK(back.value.list[6].kind == Value::Kind::kBlob);
  CHECK(back.value.list[6].s == std::string("\0blob", 5));
  CHECK(back.value.list[7].kind == Value::Kind::kNone);
  CHECK(back.value.list[8].list[0].kind == Value::Kind::kList);
  // A kind this build does not know (a newer writer) reads as kNone, not as an error.
  std::string buf = cbor_frame({{"version", 1}, {"value", {{"complex", 1}}}, {"returned", true}});
  SpawnResult future;
  REQUIRE(lspawn::wire::try_decode_frame(buf, future, "mem"));
  CHECK(future.value.kind == Value::Kind::kNone);
  CHECK(future.returned);
  // Two kinds at once is malformed.
  buf = cbor_frame({{"value", {{"i", 1}, {"s", "x"}}}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, future, "mem"),
                    Contains("SpawnResult.value: a value of two kinds"));
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
  std::string ok = lspawn::wire::encode_frame(sample_report());
  const auto body = static_cast<uint32_t>(ok.size() - 4);
  CHECK(lspawn::wire::try_decode_frame(ok, r, "mem", body));
  ok = lspawn::wire::encode_frame(sample_report());
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(ok, r, "mem", body - 1), Contains("exceeds the bound"));
}

TEST_CASE("wire: a length announced inside the CBOR is never trusted", "[wire]") {
  // A byte string / an array that announces 2^32 elements in a 9-byte body: the reader runs out
  // of input, it does not reserve what was announced.
  const std::string huge_bytes("\xa1\x61s\x5a\xff\xff\xff\xff", 8);
  const std::string huge_array(
      "\xa1\x64"
      "args"
      "\x9a\xff\xff\xff\xff",
      10);
  for (const std::string& body : {huge_bytes, huge_array}) {
    std::string buf = le32(static_cast<uint32_t>(body.size())) + body;
    SpawnCall c;
    CHECK_THROWS_AS(lspawn::wire::try_decode_frame(buf, c, "mem"), WireError);
  }
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
  CHECK(r == sample_report());
  // A frame whose length covers only part of the CBOR is malformed.
  const std::string whole = lspawn::wire::encode_frame(sample_report()).substr(4);
  buf = le32(static_cast<uint32_t>(whole.size() - 5)) + whole.substr(0, whole.size() - 5);
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, r, "cut"), Contains("cut: malformed ErrorReport"));
  // An empty frame holds no message at all.
  buf = le32(0);
  CHECK_THROWS_AS(lspawn::wire::try_decode_frame(buf, r, "mem"), WireError);
}

TEST_CASE("wire: garbage bytes are a WireError naming the message type", "[wire]") {
  const std::string garbage = "\xff\xff\xff\xff\x0f\x07";
  std::string buf = le32(static_cast<uint32_t>(garbage.size())) + garbage;
  ErrorReport r;
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, r, "garbage"),
                    Contains("garbage: malformed ErrorReport (6 bytes)"));
  // Valid CBOR that is not a map, and a map followed by trailing bytes.
  buf = cbor_frame(nlohmann::json::array({1, 2}));
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, r, "arr"), Contains("expected a map"));
  buf = lspawn::wire::encode_frame(sample_report());
  buf += "x";
  buf.replace(0, 4, le32(static_cast<uint32_t>(buf.size() - 4)));
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, r, "trail"), Contains("trail: malformed"));
}

TEST_CASE("wire: a field of the wrong type or range is an error naming the field", "[wire]") {
  ForkReply rep;
  std::string buf = cbor_frame({{"version", 1}, {"pid", "not a number"}});
  CHECK_THROWS_WITH(
      lspawn::wire::try_decode_frame(buf, rep, "sock"),
      Contains("sock: malformed ForkReply") && Contains("ForkReply.pid: expected an integer, got string"));
  buf = cbor_frame({{"version", 1}, {"index", 1ll << 40}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, rep, "sock"),
                    Contains("ForkReply.index: 1099511627776 is out of the field's range"));
  buf = cbor_frame({{"version", -1}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, rep, "sock"), Contains("ForkReply.version"));
  buf = cbor_frame({{"version", 1}, {"error", 5}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, rep, "sock"),
                    Contains("ForkReply.error: expected a string, got number"));
  ForkRequest req;
  buf = cbor_frame({{"version", 1}, {"env", {"A=1", 2}}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, req, "sock"), Contains("ForkRequest.env[1]"));
  buf = cbor_frame({{"version", 1}, {"call", {{"args", {{{"i", true}}}}}}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, req, "sock"),
                    Contains("ForkRequest.call.args[0].i: expected an integer, got boolean"));
  buf = cbor_frame({{"version", 1}, {"call", {{"args", {{{"tensor", "text, not bytes"}}}}}}});
  CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, req, "sock"), Contains("expected a byte string"));
  // A failed decode leaves the message at its defaults, not half filled.
  CHECK(req == ForkRequest());
}

TEST_CASE("wire: unknown fields are ignored, missing ones keep their defaults", "[wire]") {
  std::string buf = cbor_frame({{"version", 1}, {"index", 4}, {"field_of_version_2", {1, 2, 3}}});
  ChildExit e;
  REQUIRE(lspawn::wire::try_decode_frame(buf, e, "mem"));
  CHECK(e.index == 4);
  CHECK(e.pid == 0);
  CHECK(e.signal == 0);
}

TEST_CASE("wire: nesting deeper than the bound is an error, not a stack overflow", "[wire]") {
  // 1 MiB of 0x81 (an array of one element, again and again) and of maps {"k": {"k": ...}}.
  std::string maps;
  while (maps.size() < (1 << 20)) maps += "\xa1\x61k";
  for (const std::string& body : {std::string(1 << 20, '\x81'), maps}) {
    std::string buf = le32(static_cast<uint32_t>(body.size())) + body;
    SpawnResult r;
    CHECK_THROWS_WITH(lspawn::wire::try_decode_frame(buf, r, "deep", 2u << 20),
                      Contains("nested deeper than " + std::to_string(lspawn::wire::kMaxNesting)));
  }
  // Nesting within the bound works.
  Value v = Value::of_int(1);
  for (int i = 0; i < 100; ++i) v = Value::of_list({v});
  SpawnResult r;
  r.value = v;
  CHECK(round_trip(r) == r);
}

TEST_CASE("wire: random input never crashes the decoder", "[wire]") {
  std::mt19937 rng(12345);
  int parsed = 0, rejected = 0, partial = 0;
  const std::string valid = lspawn::wire::encode_frame(sample_call());
  for (int i = 0; i < 3000; ++i) {
    std::string buf;
    if (i % 3 == 2) {  // a valid frame with a few bytes flipped
      buf = valid;
      for (int k = 0; k < 3; ++k) buf[4 + rng() % (buf.size() - 4)] = static_cast<char>(rng());
    } else {
      buf.assign(rng() % 64, '\0');
      for (auto& c : buf) c = static_cast<char>(rng());
      if (buf.size() >= 4 && (i % 3 == 0)) {  // a plausible small length
        buf.replace(0, 4, le32(static_cast<uint32_t>(buf.size() - 4)));
      }
    }
    SpawnCall c;
    try {
      if (lspawn::wire::try_decode_frame(buf, c, "fuzz", 1 << 16))
        ++parsed;
      else
        ++partial;
    } catch (const WireError&) {
      ++rejected;
    }
  }
  CHECK(parsed + rejected + partial == 3000);
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
  future.version = newer;
  Pipe p;
  lspawn::wire::write_frame(p.w, future, "pipe");
  ErrorReport r;
  CHECK_THROWS_WITH(lspawn::wire::read_frame(p.r, r, "pipe"),
                    Contains("pipe: ErrorReport: message schema version") && Contains("newer than this build's"));
  std::string buf = lspawn::wire::encode_frame(future);
  CHECK_THROWS_AS(lspawn::wire::try_decode_frame(buf, r, "mem"), WireError);
}

TEST_CASE("wire: JSON files round-trip with the field names, atomically", "[wire][json]") {
  TempDir dir;
  const std::string path = dir.path + "/error.json";
  lspawn::wire::write_json_file(path, sample_report());
  ErrorReport back;
  lspawn::wire::read_json_file(path, back);
  CHECK(back == sample_report());
  FILE* f = std::fopen(path.c_str(), "r");
  REQUIRE(f != nullptr);
  char text[4096] = {};
  std::fread(text, 1, sizeof text - 1, f);
  std::fclose(f);
  CHECK_THAT(std::string(text), Contains("\"exception_type\": \"std::runtime_error\""));
  CHECK_THAT(std::string(text), Contains("\"local_rank\": 1"));
  CHECK_THAT(std::string(text), Contains("\"pid\": 4242"));  // int64 written as a number
  // The temp file was renamed over the report: nothing else remains.
  CHECK(::access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK) != 0);
  // Text that is not UTF-8 cannot go into JSON: it is replaced, the file is still written.
  ErrorReport odd = sample_report();
  odd.message = "bad \xff byte";
  lspawn::wire::write_json_file(path, odd);
  lspawn::wire::read_json_file(path, back);
  CHECK(back.message == "bad \xEF\xBF\xBD byte");
}

TEST_CASE("wire: a run's result file (--result-file) round-trips, its columns as JSON arrays", "[wire][json]") {
  TempDir dir;
  const std::string path = dir.path + "/result.json";
  lspawn::proto::RunResult r;
  r.version = lspawn::wire::kSchemaVersion;
  r.exit_code = 139;
  r.root_cause = 1;
  r.ranks = {0, 1};
  r.pids = {4242, 4243};
  r.exit_codes = {0, 0};
  r.signals = {15, 11};
  r.stopped = {1, 0};
  lspawn::wire::write_json_file(path, r);
  lspawn::proto::RunResult back;
  lspawn::wire::read_json_file(path, back);
  CHECK(back.exit_code == 139);
  CHECK(back.root_cause == 1);
  CHECK_FALSE(back.hang);
  CHECK(back.pids == r.pids);
  CHECK(back.signals == r.signals);
  CHECK(back.stopped == r.stopped);
  const std::string text = lspawn::wire::read_bounded_file(path, 1 << 16);
  CHECK_THAT(text, Contains("\"signals\": [\n    15,\n    11\n  ]"));
  // A column of the wrong type is an error naming the field.
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("{\"version\": 1, \"pids\": [1, \"x\"]}", f);
  std::fclose(f);
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(path, back), Contains("pids[1]"));
}

TEST_CASE("wire: error files written through protobuf's JSON mapping still read", "[wire][json]") {
  // Byte for byte what lspawn wrote before the schema moved to plain structs: int64 fields as
  // JSON strings, every field present.
  TempDir dir;
  const std::string path = dir.path + "/old.json";
  write_file(path, R"({
 "version": 1,
 "rank": 3,
 "local_rank": 1,
 "pid": "4242",
 "host": "node-a",
 "exception_type": "std::runtime_error",
 "message": "boom \"quoted\" \n newline",
 "backtrace": "#0 a\n#1 b\n",
 "timestamp_us": "1700000000123456",
 "failed_at_us": "1700000000123000"
})");
  ErrorReport r;
  lspawn::wire::read_json_file(path, r);
  CHECK(r == sample_report());
  write_file(path, R"({"version": 1, "pid": "-12", "timestamp_us": "99999999999999999999"})");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(path, r), Contains("ErrorReport.timestamp_us") && Contains("out of"));
  write_file(path, R"({"version": 1, "pid": "12abc"})");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(path, r), Contains("ErrorReport.pid: expected an integer"));
}

TEST_CASE("wire: bad JSON files are errors naming the path", "[wire][json]") {
  TempDir dir;
  ErrorReport r;
  const std::string missing = dir.path + "/missing.json";
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(missing, r), Contains("open (" + missing + ")"));
  const std::string garbage = dir.path + "/garbage.json";
  write_file(garbage, "{\"rank\": \"not a number\"");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(garbage, r), Contains(garbage) && Contains("not a valid ErrorReport"));
  write_file(garbage, "{\"rank\": \"not a number\"}");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(garbage, r),
                    Contains(garbage) && Contains("ErrorReport.rank: expected an integer, got string"));
  const std::string big = dir.path + "/big.json";
  write_file(big, "{\"message\": \"" + std::string(5000, 'x') + "\"}");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(big, r, 1000), Contains("larger than the bound of 1000 bytes"));
  const std::string deep = dir.path + "/deep.json";
  write_file(deep, std::string(100000, '[') + std::string(100000, ']'));
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(deep, r), Contains("nested deeper than"));
  // Unknown fields (a newer writer) are ignored; a newer version is not.
  const std::string unknown = dir.path + "/unknown.json";
  write_file(unknown, "{\"version\": 1, \"rank\": 2, \"future_field\": {\"a\": [true]}}");
  CHECK_NOTHROW(lspawn::wire::read_json_file(unknown, r));
  CHECK(r.rank == 2);
  const std::string newer = dir.path + "/newer.json";
  write_file(newer, "{\"version\": " + std::to_string(lspawn::wire::kSchemaVersion + 1) + ", \"rank\": 2}");
  CHECK_THROWS_WITH(lspawn::wire::read_json_file(newer, r), Contains("newer than this build's"));
  const std::string unwritable = dir.path + "/no/such/dir/x.json";
  CHECK_THROWS_WITH(lspawn::wire::write_json_file(unwritable, sample_report()), Contains(unwritable));
}
