// The gate in front of rank 0's store (runtime/store_gate.hpp): the first-bytes check of both
// store protocols, and a real TCPStore of this LibTorch behind a real gate — clients that open
// correctly are relayed, a silent one is left alone, and garbage, a probe and half a request are
// refused with a message naming the peer while the store keeps serving.
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sys/sys.hpp"
#include "runtime/rendezvous.hpp"
#include "runtime/store_gate.hpp"
#include "runtime/store_listener.hpp"
#include "runtime/torch_compat.hpp"
#include "support/loopback.hpp"
#include "support/wait.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using lspawn::check_store_head;
using lspawn::HeadVerdict;
using lspawn::StoreProtocol;
using lspawn::test::eventually;

namespace {

HeadVerdict head(StoreProtocol p, std::vector<std::uint8_t> b) { return check_store_head(p, b.data(), b.size()); }

std::vector<std::uint8_t> legacy_set(std::uint64_t key_len) {
  std::vector<std::uint8_t> b{0};  // SET
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::uint8_t>(key_len >> (8 * i)));
  return b;
}

}  // namespace

TEST_CASE("store gate: the first bytes of each store protocol", "[unit][store_gate]") {
  const auto V = StoreProtocol::Validated;
  const auto L = StoreProtocol::Legacy;
  // VALIDATE (0) and 0x3C85F7CE, little-endian: what every 2.1+ client sends first.
  CHECK(head(V, {0x00, 0xce, 0xf7, 0x85, 0x3c}) == HeadVerdict::Accept);
  CHECK(head(V, {0x00, 0xce, 0xf7}) == HeadVerdict::NeedMore);
  CHECK(head(V, {0x00, 0xce, 0xf7, 0x85, 0x3d}) == HeadVerdict::Refuse);
  CHECK(head(V, {0x01}) == HeadVerdict::Refuse);                // a SET without validation
  CHECK(head(V, {'G', 'E', 'T', ' '}) == HeadVerdict::Refuse);  // a probe
  // 1.13: a query type, then a sane length.
  CHECK(head(L, legacy_set(40)) == HeadVerdict::Accept);
  CHECK(head(L, legacy_set(lspawn::kMaxFirstLength)) == HeadVerdict::Accept);
  CHECK(head(L, legacy_set(lspawn::kMaxFirstLength + 1)) == HeadVerdict::Refuse);
  CHECK(head(L, legacy_set(0x0000'4745'5420'2f20ull)) == HeadVerdict::Refuse);  // terabytes
  CHECK(head(L, {0x00, 0x05}) == HeadVerdict::NeedMore);
  CHECK(head(L, {6}) == HeadVerdict::Accept);  // GETNUMKEYS has no argument
  CHECK(head(L, {'G'}) == HeadVerdict::Refuse);
  CHECK(head(L, {}) == HeadVerdict::NeedMore);
}

TEST_CASE("store gate: a real store behind it serves its clients and refuses garbage with a message naming the peer",
          "[store_gate]") {
  // A TCPStore of this LibTorch on loopback, and a gate with a captured log in front of it.
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = 5s;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  std::mutex mu;
  std::vector<std::string> log;
  const int public_fd = lspawn::listen_socket("127.0.0.1", 0);
  // A head deadline of 1 s (the default is kStoreReceiveTimeout, 30 s) keeps the test short.
  lspawn::StoreGate gate(
      public_fd, server->getPort(), lspawn::compat::store_protocol(), "gate-under-test",
      [&](const std::string& line) {
        std::lock_guard<std::mutex> l(mu);
        log.push_back(line);
      },
      1s);
  auto logged = [&](const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& line : log) {
      if (line.find(what) != std::string::npos) return true;
    }
    return false;
  };

  // A silent connection (1.13's callback client, a port check) is neither refused nor logged.
  const int silent = lspawn::test::connect_to(gate.port());
  REQUIRE(silent >= 0);
  // An HTTP probe, and half a request held open.
  const int probe = lspawn::test::connect_to(gate.port());
  REQUIRE(probe >= 0);
  const char get[] = "GET / HTTP/1.0\r\n\r\n";
  REQUIRE(::send(probe, get, sizeof get - 1, MSG_NOSIGNAL) > 0);
  const int half = lspawn::test::connect_to(gate.port());
  REQUIRE(half >= 0);
  const unsigned char partial[] = {0x00};
  REQUIRE(::send(half, partial, sizeof partial, MSG_NOSIGNAL) == 1);

  // Real clients through the gate: set, get, a wait woken by another client's set.
  auto a = lspawn::connect_store("127.0.0.1", gate.port(), 5s);
  auto b = lspawn::connect_store("127.0.0.1", gate.port(), 5s);
  a->set("k", std::vector<uint8_t>{1, 2, 3});
  CHECK(b->get("k") == std::vector<uint8_t>{1, 2, 3});
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    b->set("later", std::vector<uint8_t>(100000, 7));  // larger than one relay chunk
  });
  a->wait({"later"}, 5s);
  setter.join();
  CHECK(a->get("later") == std::vector<uint8_t>(100000, 7));
  CHECK(server->get("k") == std::vector<uint8_t>{1, 2, 3});  // the same store behind the gate

  REQUIRE(eventually([&] { return logged("47 45 54 20"); }, 5s));
  CHECK(logged("store at gate-under-test: refused a connection from 127.0.0.1:"));
  CHECK(logged("not a c10d store request (first bytes 47 45 54 20"));
  // The half request: 1 byte, then nothing for the head deadline.
  REQUIRE(eventually([&] { return logged("sent 1 byte of a request (00), then nothing for 1000 ms"); }, 5s));
  CHECK(gate.refused() == 2);
  char c;
  CHECK(::recv(probe, &c, 1, 0) <= 0);  // the gate closed the refused connections (a reset: it
  CHECK(::recv(half, &c, 1, 0) <= 0);   // left the probe's bytes unread)
  {
    std::lock_guard<std::mutex> l(mu);
    INFO(log.size() << " lines");
    CHECK(log.size() == 2);  // the silent connection and the real clients said nothing
  }
  ::close(silent);
  ::close(probe);
  ::close(half);
  CHECK(b->get("k") == std::vector<uint8_t>{1, 2, 3});  // still served
}

TEST_CASE("store gate: a store that goes away closes its relayed clients", "[store_gate]") {
  auto hosted = lspawn::host_store("127.0.0.1", 0, 5s, "127.0.0.1");
  auto client = lspawn::connect_store("127.0.0.1", hosted->public_port(), 5s);
  client->set("x", std::vector<uint8_t>{1});
  CHECK(hosted->refused() == 0);
  hosted.reset();  // rank 0 leaves: the gate, then the server
  client->setTimeout(2s);
  CHECK_THROWS(client->get("x"));
}

// The gate serves every connection from one thread (epoll): many clients at once are all relayed,
// while one of them holds half a request open.
TEST_CASE("store gate: many clients at once are all relayed while one holds half a request", "[store_gate]") {
  auto hosted = lspawn::host_store("127.0.0.1", 0, 10s, "127.0.0.1");
  const int half = lspawn::test::connect_to(hosted->public_port());
  REQUIRE(half >= 0);
  const unsigned char partial[] = {0x00};
  REQUIRE(::send(half, partial, sizeof partial, MSG_NOSIGNAL) == 1);
  constexpr int kClients = 64;
  std::vector<std::thread> ranks;
  std::vector<std::vector<uint8_t>> got(kClients);
  std::mutex mu;
  std::vector<std::string> errors;
  for (int r = 0; r < kClients; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto c = lspawn::connect_store("127.0.0.1", hosted->public_port(), 10s);
        c->set("rank_" + std::to_string(r), std::vector<uint8_t>(60, static_cast<uint8_t>(r)));
        c->add("count", 1);
        got[r] = c->get("rank_" + std::to_string((r + 1) % kClients));  // waits for its peer
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : ranks) t.join();
  INFO((errors.empty() ? std::string() : errors.front()));
  CHECK(errors.empty());
  for (int r = 0; r < kClients; ++r)
    CHECK(got[r] == std::vector<uint8_t>(60, static_cast<uint8_t>((r + 1) % kClients)));
  CHECK(hosted->add("count", 0) == kClients);
  // The half request is still waiting (its deadline, kStoreReceiveTimeout, is 30 s) and held
  // nobody up; closed, it is refused at once, naming what it sent.
  CHECK(hosted->refused() == 0);
  ::close(half);
  REQUIRE(eventually([&] { return hosted->refused() == 1; }, 5s));
}

// A lossy link (#47, docs/reliability.md "Slow and lossy links"): TCP resends a lost segment
// after its retransmission timeout (1 s at least, doubling), so a request's writes can reach the
// store seconds apart. A relay between a real client and the gate holds back all but the first
// byte of each of the client's writes for 1.5 s: the first request's header and every later
// request arrive in parts. Until #47 the gate refused such a head after 1 s, and the server
// (SO_RCVTIMEO 1 s) dropped the client in the middle of a later request: "Connection reset by peer".
TEST_CASE("store gate: a client whose requests arrive in parts 1.5 s apart is served", "[store_gate]") {
  auto hosted = lspawn::host_store("127.0.0.1", 0, 30s, "127.0.0.1");
  lspawn::test::LoopbackListener front;
  std::atomic<bool> done{false};
  // One relay per connection the client opens (1.13's client opens two: requests and callbacks).
  auto relay = [&](lspawn::sys::Fd client) {
    const lspawn::sys::Fd gate(lspawn::test::connect_to(hosted->public_port()));
    if (!gate) return;
    pollfd p[2] = {{client.get(), POLLIN, 0}, {gate.get(), POLLIN, 0}};
    char buf[65536];
    while (!done) {
      if (::poll(p, 2, 100) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t r = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (r <= 0) return;
        const int to = p[1 - i].fd;
        if (i == 0 && r > 1) {  // client -> store: the first byte now, the rest 1.5 s later
          ::send(to, buf, 1, MSG_NOSIGNAL);
          std::this_thread::sleep_for(1500ms);
          ::send(to, buf + 1, static_cast<std::size_t>(r - 1), MSG_NOSIGNAL);
        } else {
          ::send(to, buf, static_cast<std::size_t>(r), MSG_NOSIGNAL);
        }
      }
    }
  };
  std::vector<std::thread> relays;
  std::thread acceptor([&] {
    pollfd p{front.fd(), POLLIN, 0};
    while (!done) {
      if (::poll(&p, 1, 100) <= 0) continue;
      lspawn::sys::Fd c(::accept4(front.fd(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c) relays.emplace_back(relay, std::move(c));
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto c = lspawn::connect_store("127.0.0.1", front.port(), 30s);
  c->set("k", std::vector<uint8_t>{1, 2, 3});
  CHECK(c->get("k") == std::vector<uint8_t>{1, 2, 3});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("took " << took << " s");
  c.reset();  // the client first: its connections close before the relays' ends
  done = true;
  acceptor.join();
  for (auto& t : relays) t.join();
  CHECK(took > 1.5);  // the relay did split the requests
  CHECK(hosted->refused() == 0);
  CHECK(hosted->get("k") == std::vector<uint8_t>{1, 2, 3});
}

// The gate connects to the server without blocking its thread: a server whose accept queue is full
// stalls the client that waits for it, and nobody else (the gate still refuses garbage meanwhile).
TEST_CASE("store gate: a server that does not accept stalls only the client waiting for it", "[store_gate]") {
  // A "server" that listens with a backlog of 0 and never accepts, its queue filled: further SYNs
  // to it are dropped, so a connect to it stays in progress.
  lspawn::test::LoopbackListener stalled(0);
  const auto stalled_port = stalled.port();
  std::vector<int> fillers;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(stalled_port);
  for (int i = 0; i < 8; ++i) {
    const int f = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ::connect(f, reinterpret_cast<sockaddr*>(&a), sizeof a);
    fillers.push_back(f);
  }
  std::mutex mu;
  std::vector<std::string> log;
  auto logged = [&](const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    for (const auto& line : log) {
      if (line.find(what) != std::string::npos) return true;
    }
    return false;
  };
  {
    lspawn::StoreGate gate(lspawn::listen_socket("127.0.0.1", 0), stalled_port, lspawn::compat::store_protocol(),
                           "gate-under-test", [&](const std::string& line) {
                             std::lock_guard<std::mutex> l(mu);
                             log.push_back(line);
                           });
    // A: a valid first request; the gate's connect to the stalled server stays in progress.
    const int waiting = lspawn::test::connect_to(gate.port());
    REQUIRE(waiting >= 0);
    const std::vector<std::uint8_t> valid = lspawn::compat::store_protocol() == StoreProtocol::Validated
                                                ? std::vector<std::uint8_t>{0x00, 0xce, 0xf7, 0x85, 0x3c}
                                                : legacy_set(40);
    REQUIRE(::send(waiting, valid.data(), valid.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(valid.size()));
    std::this_thread::sleep_for(100ms);  // let the gate start that connect (it would block here)
    // B: garbage, refused while A still waits: the gate's thread is not inside A's connect.
    const int probe = lspawn::test::connect_to(gate.port());
    REQUIRE(probe >= 0);
    const char get[] = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(::send(probe, get, sizeof get - 1, MSG_NOSIGNAL) > 0);
    REQUIRE(eventually([&] { return logged("not a c10d store request"); }, 4s));
    CHECK_FALSE(logged("cannot reach the store server"));  // A: still connecting (its limit is 5 s)
    CHECK(gate.refused() == 1);
    ::close(waiting);
    ::close(probe);
  }
  for (int f : fillers) ::close(f);
  stalled.close();
}

TEST_CASE(
    "store server: the libuv server's refusal of a handed-over socket (torch 2.4) switches to the legacy server, "
    "nothing else does",
    "[rendezvous][compat]") {
  c10d::TCPStoreOptions o;
  const std::runtime_error refusal(
      "The libuv TCPStore backend does not support initialization with an listen fd. Please switch to the legacy "
      "TCPStore by setting environment variable USE_LIBUV to \"0\".");
  const std::runtime_error other("Address already in use");
#if TORCH_VERSION_MAJOR >= 2
  REQUIRE(o.useLibUV);
  CHECK_FALSE(lspawn::compat::use_legacy_store_server(o, other));
  CHECK(o.useLibUV);
  CHECK(lspawn::compat::use_legacy_store_server(o, refusal));
  CHECK_FALSE(o.useLibUV);
  // Already on the legacy server: the refusal cannot come from it, so it is not retried again.
  CHECK_FALSE(lspawn::compat::use_legacy_store_server(o, refusal));
#else
  // 1.13 has one server: nothing to switch to.
  CHECK_FALSE(lspawn::compat::use_legacy_store_server(o, refusal));
#endif
}
