// proto/node_wire.hpp: the control channel's frames and bodies, fed good, garbage, oversize,
// truncated and out-of-range input. The bodies are crafted by hand (as another writer would) with
// nlohmann::json.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "proto/node_messages.hpp"
#include "proto/node_wire.hpp"

using namespace lspawn;
using lspawn::wire::WireError;
using json = nlohmann::json;

namespace {

std::string cbor_of(const json& doc) {
  std::string out;
  json::to_cbor(doc, out);
  return out;
}

std::string be32(uint32_t n) {
  std::string s;
  for (int k = 24; k >= 0; k -= 8) s.push_back(static_cast<char>((n >> k) & 0xff));
  return s;
}

template <class Msg>
Msg body_round_trip(const Msg& m) {
  Msg out;
  wire::decode_node_body(wire::encode_node_body(m), out);
  return out;
}

proto::Cause sample_cause() {
  proto::Cause c;
  c.kind = proto::CauseKind::NodeLost;
  c.restart_count = 2;
  c.rank = 5;
  c.node_rank = 1;
  c.host = "lsp-b";
  c.exit_code = 137;
  c.time_us = 1700000000123456;
  c.text = "lspawn: root cause: node 1 (lsp-b) was lost\n";
  c.before_rendezvous = true;
  return c;
}

void check_same(const proto::Cause& a, const proto::Cause& b) {
  CHECK(a.kind == b.kind);
  CHECK(a.restart_count == b.restart_count);
  CHECK(a.rank == b.rank);
  CHECK(a.node_rank == b.node_rank);
  CHECK(a.host == b.host);
  CHECK(a.exit_code == b.exit_code);
  CHECK(a.time_us == b.time_us);
  CHECK(a.text == b.text);
  CHECK(a.before_rendezvous == b.before_rendezvous);
}

}  // namespace

TEST_CASE("node wire: every message's fields round-trip", "[node_wire]") {
  proto::JoinMsg j;
  j.host = "lsp-b";
  j.node_rank = 3;
  j.nnodes = 4;
  j.min_nnodes = 2;
  j.nproc_per_node = 8;
  j.max_restarts = 1;
  j.run_id = "r1";
  j.worker_addr = "10.0.0.2";
  j.worker_port = 29400;
  const auto j2 = body_round_trip(j);
  CHECK(j2.version == proto::kNodeProtocolVersion);
  CHECK(j2.host == "lsp-b");
  CHECK(j2.node_rank == 3);
  CHECK(j2.nnodes == 4);
  CHECK(j2.min_nnodes == 2);
  CHECK(j2.nproc_per_node == 8);
  CHECK(j2.max_restarts == 1);
  CHECK(j2.run_id == "r1");
  CHECK(j2.worker_addr == "10.0.0.2");
  CHECK(j2.worker_port == 29400);

  CHECK(body_round_trip(proto::JoinedMsg{7}).joined == 7);

  proto::AssignMsg a;
  a.node_rank = 2;
  a.nnodes = 3;
  a.nproc_per_node = 4;
  a.max_restarts = 5;
  a.run_id = "r";
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  a.hosts = {"a", "b", "c"};
  a.coordinator = 1;
  a.restart_count = 6;
  a.restarts_used = 2;
  const auto a2 = body_round_trip(a);
  CHECK(a2.node_rank == 2);
  CHECK(a2.nnodes == 3);
  CHECK(a2.nproc_per_node == 4);
  CHECK(a2.max_restarts == 5);
  CHECK(a2.run_id == "r");
  CHECK(a2.master_addr == "10.0.0.1");
  CHECK(a2.master_port == 29500);
  CHECK(a2.hosts == a.hosts);
  CHECK(a2.coordinator == 1);
  CHECK(a2.restart_count == 6);
  CHECK(a2.restarts_used == 2);

  CHECK(body_round_trip(proto::RejectMsg{"no"}).reason == "no");
  check_same(body_round_trip(proto::FailedMsg{sample_cause()}).cause, sample_cause());
  const auto s = body_round_trip(proto::StopMsg{4, sample_cause()});
  CHECK(s.restart_count == 4);
  check_same(s.cause, sample_cause());
  const auto d = body_round_trip(proto::DoneMsg{3, true, sample_cause()});
  CHECK(d.restart_count == 3);
  CHECK(d.failed);
  check_same(d.cause, sample_cause());
  CHECK(body_round_trip(proto::BusyMsg{int64_t{1} << 40}).ms == int64_t{1} << 40);
  const auto st = body_round_trip(proto::StartMsg{2, 1, sample_cause(), 41234});
  CHECK(st.restart_count == 2);
  CHECK(st.restarts_used == 1);
  check_same(st.cause, sample_cause());
  CHECK(st.master_port == 41234);
  const auto f = body_round_trip(proto::FinishMsg{9, true, 3, sample_cause()});
  CHECK(f.exit_code == 9);
  CHECK(f.failed);
  CHECK(f.restart_count == 3);
  check_same(f.cause, sample_cause());
  CHECK(wire::encode_node_body(proto::Heartbeat{}) == std::string(1, '\xa0'));  // {}

  proto::StackAskMsg ask{1, {0, 7, 4095}};
  CHECK(body_round_trip(ask).ranks == ask.ranks);
}

TEST_CASE("node wire: a rank's status record round-trips, every field, an absent record as null", "[node_wire]") {
  proto::GroupRecord g;
  g.name = "world";
  g.group_rank = 1;
  g.group_size = 4;
  g.in_collective = true;
  g.seq = std::numeric_limits<uint64_t>::max();
  g.op = "all_reduce";
  g.bytes = uint64_t{16} << 30;
  g.since_us = -5;
  g.completed_seq = 1042;
  g.completed_op = "broadcast";
  g.completed_us = 1700000000000000;
  g.version = 99;
  proto::RankRecord r;
  r.rank = 3;
  r.pid = 4242;
  r.opened_us = 17;
  r.stack_signal = 40;
  r.groups = {g, proto::GroupRecord{}};
  r.groups_dropped = 2;
  r.torn = true;
  proto::RankStatus with;
  with.rank = 3;
  with.pid = 4242;
  with.host = "lsp-b";
  with.exited = true;
  with.exit_text = "has exited (exit code 0)";
  with.started_us = 12;
  with.record = r;
  with.record_problem = "torn";
  with.stack = {"#0 f", "#1 g"};
  with.stack_problem = "no answer in 1 s";
  proto::StatusMsg m{2, {with, proto::RankStatus{}}};
  const std::string body = wire::encode_node_body(m);
  CHECK(json::from_cbor(body)["ranks"][1]["record"].is_null());
  proto::StatusMsg got;
  wire::decode_node_body(body, got);
  CHECK(got.restart_count == 2);
  REQUIRE(got.ranks.size() == 2);
  const auto& w = got.ranks[0];
  CHECK(w.rank == 3);
  CHECK(w.pid == 4242);
  CHECK(w.host == "lsp-b");
  CHECK(w.exited);
  CHECK(w.exit_text == with.exit_text);
  CHECK(w.started_us == 12);
  CHECK(w.record_problem == "torn");
  CHECK(w.stack == with.stack);
  CHECK(w.stack_problem == with.stack_problem);
  REQUIRE(w.record);
  CHECK(w.record->rank == 3);
  CHECK(w.record->pid == 4242);
  CHECK(w.record->opened_us == 17);
  CHECK(w.record->stack_signal == 40);
  CHECK(w.record->groups_dropped == 2);
  CHECK(w.record->torn);
  REQUIRE(w.record->groups.size() == 2);
  const auto& g2 = w.record->groups[0];
  CHECK(g2.name == "world");
  CHECK(g2.group_rank == 1);
  CHECK(g2.group_size == 4);
  CHECK(g2.in_collective);
  CHECK(g2.seq == std::numeric_limits<uint64_t>::max());
  CHECK(g2.op == "all_reduce");
  CHECK(g2.bytes == uint64_t{16} << 30);
  CHECK(g2.since_us == -5);
  CHECK(g2.completed_seq == 1042);
  CHECK(g2.completed_op == "broadcast");
  CHECK(g2.completed_us == 1700000000000000);
  CHECK(g2.version == 99);
  CHECK_FALSE(got.ranks[1].record.has_value());

  proto::StacksMsg stacks{1, {with}};
  proto::StacksMsg stacks2;
  wire::decode_node_body(wire::encode_node_body(stacks), stacks2);
  REQUIRE(stacks2.ranks.size() == 1);
  CHECK(stacks2.ranks[0].stack == with.stack);
}

TEST_CASE(
    "node wire: a body of the wrong shape names the message and the field - missing fields take defaults, "
    "and unknown ones are ignored",
    "[node_wire]") {
  proto::AssignMsg a;
  CHECK_THROWS_WITH(wire::decode_node_body(cbor_of({{"node_rank", "one"}}), a),
                    Catch::Contains("malformed AssignMsg") &&
                        Catch::Contains("AssignMsg.node_rank: expected an integer, got string"));
  CHECK_THROWS_WITH(wire::decode_node_body(cbor_of({{"hosts", {"a", 1}}}), a),
                    Catch::Contains("AssignMsg.hosts[1]: expected a string, got number"));
  // Out of the field's range: refused, not truncated.
  proto::JoinMsg j;
  CHECK_THROWS_WITH(wire::decode_node_body(cbor_of({{"node_rank", int64_t{1} << 40}}), j),
                    Catch::Contains("JoinMsg.node_rank: 1099511627776 is out of the field's range"));
  CHECK(j.node_rank == -1);  // never half filled
  proto::StatusMsg st;
  CHECK_THROWS_WITH(wire::decode_node_body(cbor_of({{"ranks", {{{"record", "not an object"}}}}}), st),
                    Catch::Contains("StatusMsg.ranks[0].record: expected a map, got string"));
  CHECK_THROWS_WITH(wire::decode_node_body(cbor_of({{"ranks", {{{"record", {{"groups", {{{"seq", -1}}}}}}}}}}), st),
                    Catch::Contains("StatusMsg.ranks[0].record.groups[0].seq: -1 is out of the field's range"));
  CHECK_THROWS_AS(wire::decode_node_body(cbor_of(json::array()), a), WireError);
  CHECK_THROWS_AS(wire::decode_node_body(std::string("\xff", 1), a), WireError);
  CHECK_THROWS_AS(wire::decode_node_body(std::string(), a), WireError);

  proto::DoneMsg d;
  wire::decode_node_body(cbor_of({{"restart_count", 4}, {"from_the_future", {1, 2}}}), d);
  CHECK(d.restart_count == 4);
  CHECK_FALSE(d.failed);
  CHECK(d.cause.kind == proto::CauseKind::Worker);
  CHECK(d.cause.rank == -1);
}

TEST_CASE("node wire: deeply nested bodies and frames are refused, not recursed into", "[node_wire]") {
  const std::string deep(100000, '\x81');  // [[[[...
  proto::StatusMsg st;
  CHECK_THROWS_WITH(wire::decode_node_body(deep, st), Catch::Contains("nested deeper than"));
  wire::NodeFrame f;
  CHECK_THROWS_WITH(wire::decode_node_frame((be32(deep.size()) + deep).data(), 4 + deep.size(), f),
                    Catch::Contains("nested deeper than"));
}

TEST_CASE("node wire: frames - big-endian length, {t, m}, bounded before allocating, whole or not at all",
          "[node_wire]") {
  const std::string body = wire::encode_node_body(proto::JoinedMsg{3});
  const std::string frame = wire::encode_node_frame("joined", body);
  // The bytes of protocol 2 and 3 (change them and kNodeProtocolVersion goes up): length, {"t": "joined",
  // "m": {"joined": 3}}.
  const std::string expected = be32(21) + "\xa2\x61t\x66joined\x61m\xa1\x66joined\x03";
  CHECK(frame == expected);
  wire::NodeFrame f;
  for (size_t n = 0; n < frame.size(); ++n) CHECK(wire::decode_node_frame(frame.data(), n, f) == 0);
  REQUIRE(wire::decode_node_frame(frame.data(), frame.size(), f) == frame.size());
  CHECK(f.type == "joined");
  CHECK(f.body == body);
  // An empty body is a map of none.
  CHECK(wire::encode_node_frame("hb", "") == be32(9) + "\xa2\x61t\x62hb\x61m\xa0");

  // Above the bound: refused from the 4 bytes of length alone.
  CHECK_THROWS_WITH(wire::decode_node_frame(be32(wire::kMaxNodeFrame + 1).data(), 4, f),
                    "length 1048577 exceeds 1048576");
  CHECK_THROWS_WITH(wire::decode_node_frame(be32(100).data(), 4, f, 99), "length 100 exceeds 99");
  CHECK_THROWS_WITH(wire::encode_node_frame("reject", std::string(200, 'x'), 100),
                    "message 'reject' of 212 bytes exceeds the frame limit of 100");

  // Not CBOR, not a map, no type, a type that is no text, no body, trailing bytes.
  const auto refused = [&](const std::string& cbor) {
    const std::string bytes = be32(static_cast<uint32_t>(cbor.size())) + cbor;
    CHECK_THROWS_AS(wire::decode_node_frame(bytes.data(), bytes.size(), f), WireError);
  };
  refused("\xff\xff\xff");
  refused(cbor_of(json::array({1, 2})));
  refused(cbor_of({{"m", json::object()}}));
  refused(cbor_of({{"t", 5}, {"m", json::object()}}));
  refused(cbor_of({{"t", "hb"}}));
  refused(cbor_of({{"t", "hb"}, {"m", json::object()}}) + std::string(1, '\0'));
  const std::string no_type = be32(4) + cbor_of({{"x", 1}});
  CHECK_THROWS_WITH(wire::decode_node_frame(no_type.data(), no_type.size(), f),
                    "frame of 4 bytes: no message type (a text at \"t\")");
}

TEST_CASE("node wire: AssignEncoder's bodies decode as the assignment with each node's rank", "[node_wire]") {
  proto::AssignMsg a;
  a.nnodes = 300;
  a.run_id = "r1";
  for (int i = 0; i < a.nnodes; ++i) a.hosts.push_back("node-" + std::to_string(i));
  const wire::AssignEncoder enc(a);
  for (int r : {0, 23, 24, 255, 256, 65535, 65536, -1}) {
    proto::AssignMsg got;
    wire::decode_node_body(enc.for_node(r), got);
    CHECK(got.node_rank == r);
    CHECK(got.hosts == a.hosts);
    CHECK(got.run_id == "r1");
    proto::AssignMsg same = a;
    same.node_rank = r;
    CHECK(json::from_cbor(enc.for_node(r)) == json::from_cbor(wire::encode_node_body(same)));
  }
}

TEST_CASE("node wire: a cause's kind travels as its name - a name no kind has is refused, naming the field",
          "[node_wire]") {
  for (const auto kind : {proto::CauseKind::Worker, proto::CauseKind::NodeLost, proto::CauseKind::Signal,
                          proto::CauseKind::Hang, proto::CauseKind::Membership}) {
    proto::FailedMsg m;
    m.cause.kind = kind;
    const std::string body = wire::encode_node_body(m);
    CHECK(json::from_cbor(body)["cause"]["kind"] == proto::cause_kind_name(kind));  // protocol 2's strings
    proto::FailedMsg got;
    wire::decode_node_body(body, got);
    CHECK(got.cause.kind == kind);
  }
  CHECK(std::string(proto::cause_kind_name(proto::CauseKind::NodeLost)) == "node-lost");
  CHECK_FALSE(proto::parse_cause_kind("lost"));
  proto::FailedMsg f;
  CHECK_THROWS_WITH(
      wire::decode_node_body(cbor_of({{"cause", {{"kind", "lost"}}}}), f),
      Catch::Contains("cause.kind: 'lost' is no cause kind (worker, node-lost, signal, hang, membership)"));
  CHECK_THROWS_WITH(wire::decode_node_body(cbor_of({{"cause", {{"kind", 3}}}}), f), Catch::Contains("cause.kind"));
}
