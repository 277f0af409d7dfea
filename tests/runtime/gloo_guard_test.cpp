// GlooGuard in one process (runtime/gloo_guard.hpp): what accept() admits on a listener bound in
// a GlooSetupScope, what it refuses and says, and that other sockets are left alone. Its own
// executable: the guard, once installed, is the process's for good. Real gloo groups under
// attack: secure_rendezvous_test.cpp.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "runtime/gloo_guard.hpp"
#include "runtime/record_auth.hpp"
#include "runtime/torch_compat.hpp"
#include "support/files.hpp"
#include "support/loopback.hpp"
#include "support/temp_dir.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
using lspawn::GlooGuard;
using lspawn::GlooSetupScope;
using lspawn::RecordAuth;

namespace {

const std::string kSecret = "gloo-guard-test-secret-0123456789abcdef";
const std::string kRun = "gloo-guard-run";
// The guard of this process: a rank of round 1 of run kRun (record_auth.hpp, round_secret()).
RecordAuth round_auth(int round = 1) { return RecordAuth::for_round(kSecret, kRun, round); }

// A listening TCP socket on 127.0.0.1, port 0 (bound with the process's bind()); the caller closes it.
int listener(bool nonblocking) { return lspawn::test::LoopbackListener(16, nonblocking).release(); }

sockaddr_in address_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return a;
}

// A client connected to `l` with the process's connect(), having sent `first`.
int client(int l, const std::string& first = {}) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const sockaddr_in a = address_of(l);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  if (!first.empty())
    REQUIRE(::send(fd, first.data(), first.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(first.size()));
  return fd;
}

std::string token_bytes(const RecordAuth::Token& t) { return std::string(t.begin(), t.end()); }

uint16_t peer_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

uint16_t local_port(int fd) { return ntohs(address_of(fd).sin_port); }

// stderr of the process while alive, for the guard's messages (written to fd 2 directly).
class CaptureStderr {
 public:
  CaptureStderr() : path_(dir_.file("stderr")) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() { restore(); }
  std::string text() {
    restore();
    return lspawn::test::read_file(path_);
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  lspawn::test::TempDir dir_;
  std::string path_;
  int saved_ = -1;
};

void install() {
  GlooGuard::install(round_auth(), "rank 0/2");
  REQUIRE(GlooGuard::active());
}

}  // namespace

TEST_CASE("gloo guard: a scoped connection carries a token that the scoped listener admits", "[security]") {
  install();
  int l = -1, c = -1;
  const auto sent = GlooGuard::sent(), admitted = GlooGuard::admitted();
  {
    GlooSetupScope scope;
    l = listener(false);
    c = client(l);  // sends the token once connected
  }
  CHECK(GlooGuard::sent() == sent + 1);
  const int a = ::accept(l, nullptr, nullptr);
  REQUIRE(a >= 0);
  CHECK(GlooGuard::admitted() == admitted + 1);
  // gloo's own bytes follow, untouched.
  REQUIRE(::send(c, "gloo", 4, MSG_NOSIGNAL) == 4);
  char buf[8] = {};
  CHECK(::recv(a, buf, sizeof buf, 0) == 4);
  CHECK(std::string(buf, 4) == "gloo");
  for (int fd : {a, c, l}) ::close(fd);
}

TEST_CASE("gloo guard: strangers are refused and named, the next real peer is what accept() returns", "[security]") {
  install();
  int l = -1;
  {
    GlooSetupScope scope;
    l = listener(true);  // gloo 2.x's is non-blocking
  }
  const RecordAuth auth = round_auth();
  const std::string good = token_bytes(auth.connection_token());
  CaptureStderr err;
  const auto refused = GlooGuard::refused();
  const int junk = client(l, "GET / HTTP/1.0\r\n\r\n");
  const int seq = client(l, std::string(8, '\0'));
  const int forged = client(l, token_bytes(RecordAuth("another-secret-0123456789").connection_token()));
  const int half = client(l, good.substr(0, 10));
  ::shutdown(half, SHUT_WR);  // closes after 10 bytes of a token
  const int real = client(l, good);
  const int replay = client(l, good);
  const int a = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(a >= 0);
  CHECK(peer_port(a) == local_port(real));
  const int b = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);  // only the replay was left: refused
  if (lspawn::compat::kGlooListenerPerPair) {
    // 1.13: a pair's accept() returns a stand-in (made to the listener itself) after a refusal.
    REQUIRE(b >= 0);
    CHECK(local_port(b) == local_port(l));
    ::close(b);
  } else {
    CHECK(b == -1);
    CHECK(errno == EAGAIN);
  }
  const std::string text = err.text();
  INFO(text);
  CHECK(GlooGuard::refused() == refused + 5);
  const std::string at =
      "[lspawn] rank 0/2: gloo at 127.0.0.1:" + std::to_string(local_port(l)) + " refused a connection from 127.0.0.1:";
  CHECK_THAT(text, Contains(at + std::to_string(local_port(junk)) +
                            ": not an lspawn connection token (first bytes 47 45 54 20 2f 20 48 54); the job goes on"));
  CHECK_THAT(text, Contains(at + std::to_string(local_port(seq)) + ": not an lspawn connection token (first bytes 00"));
  CHECK_THAT(text, Contains(at + std::to_string(local_port(forged)) +
                            ": a connection token not signed with this job's secret"));
  CHECK_THAT(text,
             Contains(at + std::to_string(local_port(half)) + ": it closed after 10 bytes of a connection token"));
  CHECK_THAT(text, Contains(at + std::to_string(local_port(replay)) + ": a connection token used before (a replay)"));
  CHECK(text.find(kSecret) == std::string::npos);
  for (int fd : {a, junk, seq, forged, half, real, replay, l}) ::close(fd);
}

// Before the cap's case below: its messages must still be printed.
TEST_CASE("gloo guard: a token of another round of the job, or of the job secret itself, is refused", "[security]") {
  install();  // round 1's key
  int l = -1;
  {
    GlooSetupScope scope;
    l = listener(true);
  }
  CaptureStderr err;
  const auto refused = GlooGuard::refused();
  // A worker of round 0 that woke up late (its node was frozen), and one given the job secret itself.
  const int stale = client(l, token_bytes(round_auth(0).connection_token()));
  const int raw = client(l, token_bytes(RecordAuth(kSecret).connection_token()));
  const int real = client(l, token_bytes(round_auth(1).connection_token()));
  const int a = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(a >= 0);
  CHECK(peer_port(a) == local_port(real));
  const std::string text = err.text();
  INFO(text);
  CHECK(GlooGuard::refused() == refused + 2);
  const std::string at =
      "[lspawn] rank 0/2: gloo at 127.0.0.1:" + std::to_string(local_port(l)) + " refused a connection from 127.0.0.1:";
  for (int fd : {stale, raw}) {
    CHECK_THAT(
        text, Contains(at + std::to_string(local_port(fd)) + ": a connection token not signed with this job's secret"));
  }
  for (int fd : {a, stale, raw, real, l}) ::close(fd);
}

TEST_CASE("gloo guard: after kGlooRefusalsPrinted messages, refusals are counted, not printed", "[security]") {
  install();
  int l = -1;
  {
    GlooSetupScope scope;
    l = listener(true);
  }
  const auto before = GlooGuard::refused();  // other cases of this process may have refused some
  const int more = lspawn::kGlooRefusalsPrinted + 5;
  CaptureStderr err;
  for (int i = 0; i < more; ++i) {
    const int c = client(l, "junk");
    const int a = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (a >= 0) ::close(a);  // 1.13: the stand-in after a refusal
    ::close(c);
  }
  // On 1.13 a stand-in's relay thread, still waiting on the listener, may take one and refuse it.
  for (int i = 0; i < 500 && GlooGuard::refused() < before + more; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string text = err.text();
  INFO(text);
  CHECK(GlooGuard::refused() == before + more);
  size_t lines = 0;
  for (size_t at = 0; (at = text.find("refused a connection from", at)) != std::string::npos; ++at) ++lines;
  const auto printed_before = std::min<uint64_t>(before, lspawn::kGlooRefusalsPrinted);
  CHECK(lines == lspawn::kGlooRefusalsPrinted - printed_before);
  CHECK((text.find("(further refusals on gloo's listeners are counted, not printed)") != std::string::npos) ==
        (printed_before < static_cast<uint64_t>(lspawn::kGlooRefusalsPrinted)));
  ::close(l);
}

TEST_CASE("gloo guard: sockets outside a setup scope are left alone", "[security]") {
  install();
  const int l = listener(false);  // not gloo's
  const int c = client(l, "plain");
  const int a = ::accept(l, nullptr, nullptr);
  REQUIRE(a >= 0);
  char buf[8] = {};
  CHECK(::recv(a, buf, sizeof buf, 0) == 5);  // no token was sent, none was read
  CHECK(std::string(buf, 5) == "plain");
  for (int fd : {a, c, l}) ::close(fd);
}

TEST_CASE("gloo guard: a gloo listener's descriptor reused for another socket is left alone", "[security]") {
  install();
  int l = -1;
  {
    GlooSetupScope scope;
    l = listener(false);
  }
  const int number = l;
  ::close(l);
  const int other = listener(false);  // likely the same number, bound elsewhere, outside a scope
  INFO("gloo's listener was fd " << number << ", the new one is fd " << other);
  const int c = client(other, "plain");
  const int a = ::accept(other, nullptr, nullptr);
  REQUIRE(a >= 0);
  char buf[8] = {};
  CHECK(::recv(a, buf, sizeof buf, 0) == 5);
  for (int fd : {a, c, other}) ::close(fd);
}

TEST_CASE("gloo guard: one secret per process", "[security]") {
  install();
  CHECK_NOTHROW(GlooGuard::install(round_auth(), "rank 0/2"));
  CHECK_THROWS_AS(GlooGuard::install(RecordAuth("another-secret-0123456789"), "rank 0/2"), std::logic_error);
}

// The token wait follows the link (gloo_token_wait): on loopback, a round trip of microseconds,
// it is the fixed 2 s, so a silent stranger next to the rank holds gloo's loop thread no longer
// than before. (On a link of seconds it grows past them: bench/faults/slow_links.sh with
// LSPAWN_JOB_SECRET, docs/reliability.md.)
TEST_CASE("gloo guard: the token wait on a link of microseconds is the fixed 2 s", "[security]") {
  lspawn::test::LoopbackListener listener;
  const int client = lspawn::test::connect_to(listener.port());
  REQUIRE(client >= 0);
  const int accepted = ::accept(listener.fd(), nullptr, nullptr);
  REQUIRE(accepted >= 0);
  CHECK(lspawn::gloo_token_wait(accepted) == lspawn::kGlooTokenWait);
  CHECK(lspawn::gloo_token_wait(-1) == lspawn::kGlooTokenWait);  // no TCP_INFO: the fixed wait
  ::close(accepted);
  ::close(client);
}
