// The launchers' control channel: frames, bounded lengths, bad input, EOF, message bodies.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cluster/node_channel.hpp"
#include "cluster/node_group.hpp"

using namespace lspawn;
using namespace lspawn::node;

namespace {

// A body crafted as a stranger would: any JSON, as CBOR.
Body cbor_body(const nlohmann::json& j) {
  const auto cbor = nlohmann::json::to_cbor(j);
  return Body{std::string(cbor.begin(), cbor.end())};
}

// Two connected ends: a Link on one, a raw fd on the other.
struct Pair {
  std::unique_ptr<Link> link;
  sys::Fd raw;
  Pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds) == 0);
    link = std::make_unique<Link>(sys::Fd(fds[0]), "test peer");
    raw.reset(fds[1]);
  }
  void put(const std::string& bytes) { sys::write_all(raw.get(), bytes, "test"); }
};

std::string be32(uint32_t n) {
  std::string s;
  for (int k = 24; k >= 0; k -= 8) s.push_back(static_cast<char>((n >> k) & 0xff));
  return s;
}

}  // namespace

TEST_CASE("node channel: messages round-trip, also split across reads", "[node_channel]") {
  Pair p;
  Cause c;
  c.kind = CauseKind::Worker;
  c.rank = 3;
  c.node_rank = 1;
  c.host = "lsp-b";
  c.exit_code = 7;
  c.time_us = 123456789;
  c.text = "lspawn: root cause: process 3 terminated with exit code 7\n";
  const std::string frame = encode("failed", FailedMsg{c}) + encode("hb", Heartbeat{});
  p.put(frame.substr(0, 5));
  CHECK(p.link->read().empty());  // an incomplete frame waits
  p.put(frame.substr(5));
  auto msgs = p.link->read();
  REQUIRE(msgs.size() == 2);
  CHECK(msgs[0].type == "failed");
  const Cause got = msgs[0].as<FailedMsg>().cause;
  CHECK(got.rank == 3);
  CHECK(got.host == "lsp-b");
  CHECK(got.exit_code == 7);
  CHECK(got.time_us == 123456789);
  CHECK(got.text == c.text);
  CHECK(msgs[1].type == "hb");
}

TEST_CASE("node channel: a frame longer than the limit closes the link before allocating", "[node_channel]") {
  Pair p;
  p.put(be32(kMaxFrame + 1) + "x");
  CHECK_THROWS_WITH(p.link->read(), Catch::Contains("bad frame: length 1048577 exceeds 1048576"));
}

TEST_CASE("node channel: a frame that is not CBOR, or lacks the envelope, closes the link", "[node_channel]") {
  {
    Pair p;
    p.put(be32(3) + "\xff\xff\xff");
    CHECK_THROWS_WITH(p.link->read(), Catch::Contains("bad frame"));
  }
  {
    Pair p;
    const auto cbor = nlohmann::json::to_cbor(nlohmann::json{{"x", 1}});
    p.put(be32(static_cast<uint32_t>(cbor.size())) + std::string(cbor.begin(), cbor.end()));
    CHECK_THROWS_WITH(p.link->read(), Catch::Contains("bad frame"));
  }
}

TEST_CASE("node channel: a body of the wrong shape is a BadMessage naming it, a missing field takes its default",
          "[node_channel]") {
  Message m{"assign", cbor_body(nlohmann::json{{"node_rank", "one"}})};
  CHECK_THROWS_AS(m.as<AssignMsg>(), BadMessage);
  CHECK_THROWS_WITH(m.as<AssignMsg>(), Catch::Contains("body of 'assign'") &&
                                           Catch::Contains("AssignMsg.node_rank: expected an integer, got string"));
  // A number out of the field's range is refused too (not truncated into another node rank).
  Message big{"assign", cbor_body(nlohmann::json{{"node_rank", int64_t{1} << 32}})};
  CHECK_THROWS_WITH(big.as<AssignMsg>(),
                    Catch::Contains("body of 'assign'") && Catch::Contains("4294967296 is out of the field's range"));
  Message d{"done", cbor_body(nlohmann::json::object())};
  CHECK(d.as<DoneMsg>().failed == false);
}

TEST_CASE("node channel: the messages before EOF are delivered, then the EOF", "[node_channel]") {
  Pair p;
  FinishMsg f;
  f.exit_code = 7;
  f.failed = true;
  p.put(encode("finish", f));
  p.raw.reset();
  auto msgs = p.link->read();
  REQUIRE(msgs.size() == 1);
  CHECK(msgs[0].as<FinishMsg>().exit_code == 7);
  CHECK_THROWS_WITH(p.link->read(), "connection closed");
}

TEST_CASE("node channel: sending to a closed peer is a LinkError", "[node_channel]") {
  Pair p;
  p.raw.reset();
  CHECK_THROWS_AS(p.link->send("hb", Heartbeat{}), LinkError);
}

TEST_CASE("node channel: a node's status records round-trip (hang diagnosis across nodes)", "[node_channel]") {
  Pair p;
  StatusMsg st;
  st.restart_count = 2;
  RankInput with;
  with.rank = 3;
  with.pid = 4242;
  with.host = "lsp-b";
  with.started_us = 17;
  status::RankView v;
  v.rank = 3;
  v.pid = 4242;
  v.stack_signal = 40;
  status::GroupView g;
  g.name = "world";
  g.group_size = 4;
  g.in_collective = true;
  g.seq = 1043;
  g.op = "all_reduce";
  g.bytes = 16u << 20;
  g.since_us = 1700000000000000;
  g.version = 99;
  v.groups.push_back(g);
  with.record = v;
  RankInput without;  // no record yet, exited
  without.rank = 2;
  without.exited = true;
  without.exit_text = "has exited (exit code 0)";
  st.ranks = {with, without};
  p.put(encode("status", st));
  auto msgs = p.link->read();
  REQUIRE(msgs.size() == 1);
  const auto got = msgs[0].as<StatusMsg>();
  CHECK(got.restart_count == 2);
  REQUIRE(got.ranks.size() == 2);
  REQUIRE(got.ranks[0].record);
  CHECK(got.ranks[0].host == "lsp-b");
  CHECK(got.ranks[0].record->groups.at(0).op == "all_reduce");
  CHECK(got.ranks[0].record->groups.at(0).seq == 1043);
  CHECK(got.ranks[0].record->groups.at(0).bytes == (16u << 20));
  CHECK(got.ranks[0].record->groups.at(0).in_collective);
  CHECK(got.ranks[0].record->groups.at(0).version == 99);
  CHECK_FALSE(got.ranks[1].record.has_value());
  CHECK(got.ranks[1].exited);
  // A record of the wrong shape is a BadMessage (the launcher ignores the message, naming it).
  p.put(encode("status", cbor_body(nlohmann::json{{"restart_count", 0}, {"ranks", {{{"record", "not an object"}}}}})));
  msgs = p.link->read();
  REQUIRE(msgs.size() == 1);
  CHECK_THROWS_AS(msgs[0].as<StatusMsg>(), BadMessage);
}

// The hang watch's RankInput travels as proto's RankStatus: every field crosses the conversion.
TEST_CASE("node channel: every field of a RankInput and its record survives the channel", "[node_channel]") {
  RankInput in;
  in.rank = 5;
  in.pid = 77;
  in.host = "lsp-c";
  in.exited = true;
  in.exit_text = "was killed by SIGKILL";
  in.started_us = 42;
  in.record_problem = "torn";
  in.stack = {"#0 main", "#1 start"};
  in.stack_problem = "no handler";
  status::RankView v;
  v.rank = 5;
  v.pid = 77;
  v.opened_us = 9;
  v.stack_signal = 41;
  v.groups_dropped = 3;
  v.torn = true;
  status::GroupView g;
  g.name = "tp";
  g.group_rank = 1;
  g.group_size = 2;
  g.in_collective = true;
  g.seq = 11;
  g.op = "all_gather";
  g.bytes = 1024;
  g.since_us = 13;
  g.completed_seq = 10;
  g.completed_op = "broadcast";
  g.completed_us = 12;
  g.version = 14;
  v.groups = {g};
  in.record = v;
  StacksMsg msg;
  msg.restart_count = 3;
  msg.ranks = {in};
  const StacksMsg got = Message{"stacks", body_of(msg)}.as<StacksMsg>();
  CHECK(got.restart_count == 3);
  REQUIRE(got.ranks.size() == 1);
  const RankInput& r = got.ranks[0];
  CHECK(r.rank == 5);
  CHECK(r.pid == 77);
  CHECK(r.host == "lsp-c");
  CHECK(r.exited);
  CHECK(r.exit_text == in.exit_text);
  CHECK(r.started_us == 42);
  CHECK(r.record_problem == "torn");
  CHECK(r.stack == in.stack);
  CHECK(r.stack_problem == "no handler");
  REQUIRE(r.record);
  CHECK(r.record->rank == 5);
  CHECK(r.record->pid == 77);
  CHECK(r.record->opened_us == 9);
  CHECK(r.record->stack_signal == 41);
  CHECK(r.record->groups_dropped == 3);
  CHECK(r.record->torn);
  REQUIRE(r.record->groups.size() == 1);
  const status::GroupView& h = r.record->groups[0];
  CHECK(h.name == "tp");
  CHECK(h.group_rank == 1);
  CHECK(h.group_size == 2);
  CHECK(h.in_collective);
  CHECK(h.seq == 11);
  CHECK(h.op == "all_gather");
  CHECK(h.bytes == 1024);
  CHECK(h.since_us == 13);
  CHECK(h.completed_seq == 10);
  CHECK(h.completed_op == "broadcast");
  CHECK(h.completed_us == 12);
  CHECK(h.version == 14);
}

// A join of another protocol version still reads as a join: its version is what the coordinator
// compares and names (node_group.cpp, join_mismatch).
TEST_CASE("node channel: a join of another protocol version reads, with its version", "[node_channel]") {
  Pair p;
  p.put(encode("join",
               cbor_body(nlohmann::json{{"version", kProtocolVersion + 1}, {"host", "lsp-z"}, {"new_field", 1}})));
  auto msgs = p.link->read();
  REQUIRE(msgs.size() == 1);
  const JoinMsg j = msgs[0].as<JoinMsg>();
  CHECK(j.version == kProtocolVersion + 1);
  CHECK(j.host == "lsp-z");
  CHECK(JoinMsg{}.version == kProtocolVersion);
}

// A coordinator of K nodes assigns each its node rank and every node's host: encoded per node,
// that was O(K^2) (bench/scale: seconds at 4,096 nodes). AssignBodies encodes the rest once.
TEST_CASE("node channel: AssignBodies' bodies decode as the assignment with each node's rank", "[node_channel]") {
  AssignMsg a;
  a.nnodes = 300;
  a.nproc_per_node = 8;
  a.max_restarts = 2;
  a.run_id = "r1";
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  for (int i = 0; i < a.nnodes; ++i) a.hosts.push_back("node-" + std::to_string(i));
  a.coordinator = 0;
  a.restart_count = 1;
  a.restarts_used = 1;
  const AssignBodies bodies(a);
  for (int r : {0, 1, 23, 24, 255, 256, 299}) {  // CBOR's one-byte, two-byte and three-byte integers
    Pair p;
    p.link->send("assign", bodies.for_node(r));
    Pair back;
    char buf[65536];
    const ssize_t n = ::read(p.raw.get(), buf, sizeof buf);
    REQUIRE(n > 0);
    back.put(std::string(buf, static_cast<size_t>(n)));
    auto msgs = back.link->read();
    REQUIRE(msgs.size() == 1);
    const AssignMsg got = msgs[0].as<AssignMsg>();
    CHECK(got.node_rank == r);
    CHECK(got.nnodes == a.nnodes);
    CHECK(got.hosts == a.hosts);
    CHECK(got.run_id == a.run_id);
    CHECK(got.master_port == a.master_port);
    CHECK(got.restarts_used == 1);
    AssignMsg same = a;
    same.node_rank = r;
    CHECK(nlohmann::json::from_cbor(bodies.for_node(r).cbor) == nlohmann::json::from_cbor(body_of(same).cbor));
  }
}

// A coordinator holds a link per node: one large message (an assignment of 4,096 hosts) must not
// leave its size behind in every link's buffers.
TEST_CASE("node channel: a link keeps no large buffer once a large message is through", "[node_channel]") {
  Pair p;
  RejectMsg big;
  big.reason = std::string(200000, 'x');
  p.put(encode("reject", big));
  auto msgs = p.link->read();
  while (msgs.empty()) msgs = p.link->read();
  CHECK(msgs[0].as<RejectMsg>().reason.size() == 200000);
  p.link->send("reject", big);  // more than a socketpair takes at once: the rest stays queued
  std::string drained;
  char buf[65536];
  while (p.link->pending()) {
    const ssize_t n = ::read(p.raw.get(), buf, sizeof buf);
    if (n > 0) drained.append(buf, static_cast<size_t>(n));
    p.link->flush();
  }
  CHECK(p.link->buffered_capacity() <= 2 * Link::kKeptBuffer);
}

TEST_CASE("node group: heartbeats every second up to 1,000 nodes, ~1,000 a second beyond, within the node timeout",
          "[node_group]") {
  using std::chrono::milliseconds;
  CHECK(heartbeat_interval(2, milliseconds(30000)) == milliseconds(1000));
  CHECK(heartbeat_interval(1000, milliseconds(30000)) == milliseconds(1000));
  CHECK(heartbeat_interval(4096, milliseconds(30000)) == milliseconds(4096));
  CHECK(heartbeat_interval(100000, milliseconds(30000)) == milliseconds(7500));  // node timeout / 4
  CHECK(heartbeat_interval(2, milliseconds(2000)) == milliseconds(500));
  CHECK(heartbeat_interval(2, milliseconds(40)) == milliseconds(20));
  CHECK(status_interval(2) == milliseconds(250));
  CHECK(status_interval(4096) == milliseconds(4096));
}
