#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "runtime/rendezvous.hpp"
#include "support/child.hpp"
#include "support/ports.hpp"
#include "support/ranks.hpp"
#include "support/temp_dir.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using lspawn::test::ChildProcess;
using lspawn::test::ReservedPort;
using lspawn::test::TempDir;

namespace {

std::vector<std::string> worker(const char* mode) { return {LSPAWN_TEST_WORKER, mode}; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("rendezvous: N real processes meet on a reserved port", "[rendezvous]") {
  const int n = GENERATE(1, 2, 4);
  TempDir dir;
  ReservedPort reserved;  // as lspawn holds MASTER_PORT: bound, SO_REUSEADDR, not listening
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < n; ++r) {
    auto env = lspawn::test::contract_env(r, n, reserved.port(), "meet" + std::to_string(n));
    env["LSPAWN_RDZV_TIMEOUT"] = "30";
    ranks.emplace_back(worker("rendezvous"), env, dir.file("rank" + std::to_string(r)));
  }
  std::string pids;
  for (auto& c : ranks) pids += " " + std::to_string(c.pid());
  for (int r = 0; r < n; ++r) {
    const auto st = ranks[r].wait_or_kill(30s);
    INFO("rank " << r << "/" << n << ": " << st.describe() << "\n" << ranks[r].output());
    CHECK(st.exited);
    CHECK(st.code == 0);
    // Every rank learned every peer's pid, in rank order.
    CHECK_THAT(ranks[r].output(), Contains("peers " + std::to_string(n) + " pids" + pids));
    CHECK_THAT(ranks[r].output(), Contains("port " + std::to_string(reserved.port())));
  }
}

TEST_CASE("rendezvous: a rank that never arrives fails the others with RendezvousTimeout", "[rendezvous]") {
  TempDir dir;
  ReservedPort reserved;
  const int n = 4;
  const int missing = 2;
  std::vector<ChildProcess> ranks;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    if (r == missing) continue;
    auto env = lspawn::test::contract_env(r, n, reserved.port(), "abc");
    env["LSPAWN_RDZV_TIMEOUT"] = "2";
    ranks.emplace_back(worker("rendezvous"), env, dir.file("rank" + std::to_string(r)));
  }
  for (auto& c : ranks) {
    const auto st = c.wait_or_kill(20s);
    const std::string out = c.output();
    INFO(st.describe() << "\n" << out);
    CHECK(st.exited);
    CHECK(st.code == 3);  // RendezvousTimeout
    CHECK_THAT(out, Contains("rendezvous 'abc' timed out after"));
    CHECK_THAT(out, Contains("(timeout 2 s) at 127.0.0.1:" + std::to_string(reserved.port())));
    CHECK_THAT(out, Contains("3/4 ranks joined, missing: [2]"));
    // Each rank gave up within twice the timeout, by its own clock (from entering rendezvous();
    // process start-up under load is not counted).
    const std::string marker = "rendezvous 'abc' timed out after ";  // not c10d's own log lines (2.x)
    const auto at = out.find(marker);
    REQUIRE(at != std::string::npos);
    CHECK(std::strtod(out.c_str() + at + marker.size(), nullptr) < 2 * 2.0);
  }
  CHECK(seconds_since(t0) >= 2.0);
  CHECK(seconds_since(t0) < 60.0);
}

TEST_CASE("rendezvous: rank 0 never arrives, a client times out naming rank 0 and host:port", "[rendezvous]") {
  TempDir dir;
  ReservedPort reserved;
  auto env = lspawn::test::contract_env(1, 2, reserved.port(), "norank0");
  env["LSPAWN_RDZV_TIMEOUT"] = "1";
  ChildProcess c(worker("rendezvous"), env, dir.file("rank1"));
  const auto st = c.wait_or_kill(20s);
  INFO(st.describe() << "\n" << c.output());
  CHECK(st.code == 3);
  CHECK_THAT(c.output(), Contains("missing: [0]"));
  CHECK_THAT(c.output(),
             Contains("cannot connect to the rendezvous store at 127.0.0.1:" + std::to_string(reserved.port())));
  CHECK_THAT(c.output(), Contains("Connection refused"));
}

TEST_CASE("rendezvous: under an agent store (torchrun static) rank 0 is a client", "[rendezvous]") {
  // The launcher hosts the store; every rank, rank 0 included, connects to it.
  auto agent = lspawn::host_store("127.0.0.1", 0, 10s);
  TempDir dir;
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < 2; ++r) {
    auto env = lspawn::test::contract_env(r, 2, agent->public_port(), "agent");
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    env["TORCHELASTIC_RESTART_COUNT"] = "1";
    env["LSPAWN_RDZV_TIMEOUT"] = "20";
    ranks.emplace_back(worker("rendezvous"), env, dir.file("rank" + std::to_string(r)));
  }
  for (auto& c : ranks) {
    const auto st = c.wait_or_kill(30s);
    INFO(st.describe() << "\n" << c.output());
    CHECK(st.code == 0);
    CHECK_THAT(c.output(), Contains("peers 2"));
  }
  // The run's keys live under lspawn/<run_id>/<restart_count>/ in the agent's store.
  CHECK(agent->check({"lspawn/agent/1/rdzv/rank/0", "lspawn/agent/1/rdzv/rank/1"}));
}

TEST_CASE("host_store: port 0 picks a free port, published by public_port()", "[unit][rendezvous]") {
  auto server = lspawn::host_store("127.0.0.1", 0, 5s);
  REQUIRE(server->public_port() != 0);
  auto client = lspawn::connect_store("127.0.0.1", server->public_port(), 5s);
  client->set("k", std::vector<uint8_t>{'v'});
  // A sub-second timeout still connects (TCPStore 1.13 truncates its own to whole seconds).
  auto quick = lspawn::connect_store("127.0.0.1", server->public_port(), 300ms);
  CHECK(quick->get("k") == std::vector<uint8_t>{'v'});
  CHECK(server->get("k") == std::vector<uint8_t>{'v'});
}

TEST_CASE("host_store: TCPStore can bind a port that lspawn reserves without listening", "[unit][rendezvous]") {
  ReservedPort reserved;
  auto server = lspawn::host_store("127.0.0.1", reserved.port(), 5s);
  CHECK(server->public_port() == reserved.port());
  auto client = lspawn::connect_store("127.0.0.1", reserved.port(), 5s);
  client->set("x", std::vector<uint8_t>{1, 2});
  CHECK((server->get("x") == std::vector<uint8_t>{1, 2}));
}

TEST_CASE("host_store: a port in use (listening) is an error naming host:port", "[unit][rendezvous]") {
  ReservedPort busy(/*listening=*/true);
  const std::string where = "127.0.0.1:" + std::to_string(busy.port());
  CHECK_THROWS_AS(lspawn::host_store("127.0.0.1", busy.port(), 2s), lspawn::RendezvousError);
  CHECK_THROWS_WITH(lspawn::host_store("127.0.0.1", busy.port(), 2s),
                    Contains("cannot host the rendezvous store at " + where) &&
                        Contains("address already in use", Catch::CaseSensitive::No));  // 2.x: lower case
}

TEST_CASE("connect_store: nobody listening within the timeout is an error naming host:port", "[unit][rendezvous]") {
  ReservedPort reserved;  // refuses connections
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(
      lspawn::connect_store("127.0.0.1", reserved.port(), 500ms),
      Contains("cannot connect to the rendezvous store at 127.0.0.1:" + std::to_string(reserved.port())) &&
          Contains("timeout 0.5 s") && Contains("Connection refused"));
  CHECK(seconds_since(t0) < 5.0);
}

TEST_CASE("connect_store: a server that starts late is found before the timeout", "[unit][rendezvous]") {
  ReservedPort reserved;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    auto server = lspawn::host_store("127.0.0.1", reserved.port(), 10s);
    // Keep it up until the client has written its key.
    server->wait({"hello"}, 10s);
  });
  auto client = lspawn::connect_store("127.0.0.1", reserved.port(), 10s);
  client->set("hello", std::vector<uint8_t>{1});
  late.join();
  SUCCEED("client connected to a server that started after it");
}

TEST_CASE("resolve_rendezvous_timeout: option, then LSPAWN_RDZV_TIMEOUT, then 300 s", "[unit][rendezvous]") {
  ::unsetenv("LSPAWN_RDZV_TIMEOUT");
  CHECK(lspawn::resolve_rendezvous_timeout(0ms) == 300s);
  ::setenv("LSPAWN_RDZV_TIMEOUT", "7", 1);
  CHECK(lspawn::resolve_rendezvous_timeout(0ms) == 7s);
  CHECK(lspawn::resolve_rendezvous_timeout(1500ms) == 1500ms);
  ::setenv("LSPAWN_RDZV_TIMEOUT", "soon", 1);
  CHECK_THROWS_AS(lspawn::resolve_rendezvous_timeout(0ms), lspawn::EnvError);
  ::unsetenv("LSPAWN_RDZV_TIMEOUT");
}

namespace {
// A store without compareSet (c10d's default implementation throws).
struct StoreWithoutCompareSet : c10d::HashStore {
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return c10d::Store::compareSet(key, expected, desired);
  }
};
using Bytes = std::vector<uint8_t>;
}  // namespace

TEST_CASE("try_get: the value of a set key, nullopt for a missing one, nothing created", "[unit][rendezvous]") {
  auto server = lspawn::host_store("127.0.0.1", 0, 5s);
  auto client = lspawn::connect_store("127.0.0.1", server->public_port(), 5s);
  client->set("k", Bytes{'v'});
  client->set("empty", Bytes{});
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("pre", client);
  prefixed->set("p", Bytes{'1', '2'});
  auto fallback = c10::make_intrusive<StoreWithoutCompareSet>();
  fallback->set("f", Bytes{'x'});
  for (c10d::Store* s : {static_cast<c10d::Store*>(client.get()), static_cast<c10d::Store*>(prefixed.get()),
                         static_cast<c10d::Store*>(fallback.get())}) {
    CHECK_FALSE(lspawn::try_get(*s, "missing").has_value());
    CHECK_FALSE(s->check({"missing"}));  // probing did not create the key
  }
  CHECK(lspawn::try_get(*client, "k") == std::optional<Bytes>(Bytes{'v'}));
  CHECK(lspawn::try_get(*client, "empty") == std::optional<Bytes>(Bytes{}));
  CHECK(lspawn::try_get(*prefixed, "p") == std::optional<Bytes>(Bytes{'1', '2'}));
  CHECK(lspawn::try_get(*fallback, "f") == std::optional<Bytes>(Bytes{'x'}));
  CHECK(client->get("k") == Bytes{'v'});  // unchanged by the probe
}

// LibTorch >= 2.4's TCPStore server (libuv) wakes a client waiting for a key whenever a
// compareSet() finds that key missing, and the woken get() reads an empty value. gloo crashed on
// such a value (issue #8: SIGSEGV in gloo::transport::tcp::Rank::Rank across hosts). try_get must
// not send such a probe, and get_when_set must not return such a value, whoever sent the probe.
TEST_CASE("try_get does not wake a client waiting for the missing key", "[unit][rendezvous]") {
  auto server = lspawn::host_store("127.0.0.1", 0, 10s);
  auto waiter = lspawn::connect_store("127.0.0.1", server->public_port(), 10s);
  auto prober = lspawn::connect_store("127.0.0.1", server->public_port(), 10s);
  std::vector<uint8_t> got;
  std::thread t([&] { got = waiter->get("late"); });  // c10d's own get(): waits for the key
  std::this_thread::sleep_for(200ms);                 // the waiter is registered
  CHECK_FALSE(lspawn::try_get(*prober, "late").has_value());
  std::this_thread::sleep_for(200ms);
  prober->set("late", Bytes{'v'});
  t.join();
  CHECK(got == Bytes{'v'});
}

TEST_CASE("get_when_set: a wake-up without the key (a stranger's compareSet) does not return an empty value",
          "[unit][rendezvous]") {
  auto server = lspawn::host_store("127.0.0.1", 0, 10s);
  auto waiter = lspawn::connect_store("127.0.0.1", server->public_port(), 10s);
  auto stranger = lspawn::connect_store("127.0.0.1", server->public_port(), 10s);
  std::vector<uint8_t> got;
  std::thread t([&] { got = lspawn::get_when_set(*waiter, "late"); });
  std::this_thread::sleep_for(200ms);
  for (int i = 0; i < 3; ++i) {  // on a 2.x server each of these wakes the waiter
    stranger->compareSet("late", Bytes{'p'}, Bytes{'p'});
    std::this_thread::sleep_for(50ms);
  }
  CHECK_FALSE(stranger->check({"late"}));
  stranger->set("late", Bytes{'v'});
  t.join();
  CHECK(got == Bytes{'v'});
}

TEST_CASE("get_when_set: a key never set fails after the store timeout, naming it", "[unit][rendezvous]") {
  auto server = lspawn::host_store("127.0.0.1", 0, 10s);
  auto client = lspawn::connect_store("127.0.0.1", server->public_port(), 10s);
  client->setTimeout(300ms);
  CHECK_THROWS_WITH(lspawn::get_when_set(*client, "never"), Contains("never"));
}
