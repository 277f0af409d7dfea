#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>

#include "runtime/record_auth.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
using lspawn::RecordAuth;

namespace {
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("record auth: a sealed record opens with the same secret and key only", "[unit][security]") {
  const RecordAuth a("secret-one-0123456789"), b("secret-two-0123456789");
  const auto sealed = a.seal("k/1", bytes("host\n42"));
  REQUIRE(sealed.size() == RecordAuth::kHeaderSize + 7);
  CHECK(a.open("k/1", sealed) == bytes("host\n42"));
  CHECK_FALSE(b.open("k/1", sealed));  // another secret
  CHECK_FALSE(a.open("k/2", sealed));  // another key: records cannot be moved
  auto tampered = sealed;
  tampered.back() ^= 1;
  CHECK_FALSE(a.open("k/1", tampered));  // one bit of the value
  tampered = sealed;
  tampered[5] ^= 1;
  CHECK_FALSE(a.open("k/1", tampered));                                                   // one bit of the MAC
  CHECK_FALSE(a.open("k/1", std::vector<uint8_t>(sealed.begin(), sealed.begin() + 20)));  // truncated
  CHECK_FALSE(a.open("k/1", bytes("host\n42")));                                          // not sealed at all
  CHECK(a.open("k/1", a.seal("k/1", {})) == std::vector<uint8_t>{});                      // empty values too
}

TEST_CASE("record auth: key names depend on the secret and the key", "[unit][security]") {
  const RecordAuth a("secret-one-0123456789"), b("secret-two-0123456789");
  CHECK(a.key_name("rdzv/rank/0") == a.key_name("rdzv/rank/0"));
  CHECK(a.key_name("rdzv/rank/0") != b.key_name("rdzv/rank/0"));
  CHECK(a.key_name("rdzv/rank/0") != a.key_name("rdzv/rank/1"));
  CHECK(a.key_name("x").rfind("x#", 0) == 0);
  CHECK(a.key_name("x").size() == 2 + 32);
}

TEST_CASE("record auth: a round key - one per round and run, the same on every node, never the job secret",
          "[unit][security]") {
  const std::string job = "job-secret-0123456789abcdef";
  const std::string r0 = lspawn::round_secret(job, "run-a", 0), r1 = lspawn::round_secret(job, "run-a", 1);
  CHECK(r0.size() == 64);
  CHECK(r0.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(r0 != r1);                                                  // per round
  CHECK(r0 == lspawn::round_secret(std::string(job), "run-a", 0));  // every node derives the same
  CHECK(r0 != lspawn::round_secret(job, "run-b", 0));               // per run
  CHECK(r0 != lspawn::round_secret("job-secret-0123456789abcdeX", "run-a", 0));
  CHECK(r0 != job);
  CHECK(r0.find(job) == std::string::npos);
  // The run id and the round are framed: "run-a" + 10 is not "run-a1" + 0.
  CHECK(lspawn::round_secret(job, "run-a1", 0) != lspawn::round_secret(job, "run-a", 10));
  // Pinned (docs/security.md's bytes, computed apart with Python's hmac): nodes of one version agree.
  CHECK(lspawn::round_secret("0123456789abcdef", "r", 1) ==
        "b607ae8ef01ce35f95c54970a2a8373c6613eb9dcea82d7ba02651e11c885054");
  // A round's records and tokens are not another round's.
  const RecordAuth a = RecordAuth::for_round(job, "run-a", 0), b = RecordAuth::for_round(job, "run-a", 1);
  CHECK(a.same_secret(RecordAuth(r0)));
  CHECK_FALSE(a.same_secret(RecordAuth(job)));
  CHECK(a.key_name("rdzv/rank/0") != b.key_name("rdzv/rank/0"));
  CHECK_FALSE(b.open("k", a.seal("k", bytes("v"))));
  CHECK_FALSE(b.check_connection_token(a.connection_token()));
  CHECK(b.check_connection_token(RecordAuth::for_round(job, "run-a", 1).connection_token()));
  CHECK_THROWS_AS(RecordAuth::for_round("short", "run-a", 0), std::invalid_argument);
}

TEST_CASE("record auth: from_environment is the round key of LSPAWN_JOB_SECRET, TORCHELASTIC_RUN_ID and _RESTART_COUNT",
          "[unit][security]") {
  const std::string job = "job-secret-0123456789abcdef";
  ::setenv("LSPAWN_JOB_SECRET", job.c_str(), 1);
  ::setenv("TORCHELASTIC_RUN_ID", "run-e", 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  CHECK(RecordAuth::from_environment()->same_secret(RecordAuth::for_round(job, "run-e", 2)));
  ::unsetenv("TORCHELASTIC_RUN_ID");
  ::unsetenv("TORCHELASTIC_RESTART_COUNT");
  CHECK(RecordAuth::from_environment()->same_secret(RecordAuth::for_round(job, "none", 0)));  // WorkerEnv's defaults
  ::setenv("TORCHELASTIC_RESTART_COUNT", "x", 1);
  CHECK_THROWS_WITH(RecordAuth::from_environment(), Contains("TORCHELASTIC_RESTART_COUNT='x' is not an integer"));
  ::unsetenv("TORCHELASTIC_RESTART_COUNT");
  ::unsetenv("LSPAWN_JOB_SECRET");
  CHECK_FALSE(RecordAuth::from_environment());
}

TEST_CASE("record auth: a short secret is refused without being shown", "[unit][security]") {
  try {
    RecordAuth("short-secret");
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Contains("LSPAWN_JOB_SECRET is too short (12 characters"));
    CHECK(std::string(e.what()).find("short-secret") == std::string::npos);
  }
}

TEST_CASE("record auth: foreign records are described by what they claim", "[unit][security]") {
  CHECK(lspawn::describe_foreign_record(bytes("evil\n42")) == "claiming 'evil pid 42' (7 bytes)");
  std::vector<uint8_t> gloo(2 * (sizeof(sockaddr_storage) + 8), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(4444);
  a.sin_addr.s_addr = htonl(0x0a000005);
  std::memcpy(gloo.data(), &a, sizeof a);
  sockaddr_in6 b{};
  b.sin6_family = AF_INET6;
  b.sin6_port = htons(5555);
  b.sin6_addr.s6_addr[15] = 1;
  std::memcpy(gloo.data() + sizeof(sockaddr_storage) + 8, &b, sizeof b);
  CHECK(lspawn::describe_foreign_record(gloo) == "pointing to 10.0.0.5:4444, [::1]:5555 (272 bytes)");
  CHECK(lspawn::describe_foreign_record({0xff, 0x00}) == "claiming '??' (2 bytes)");
}

TEST_CASE("record auth: a sealed record with a wrong MAC is described by what it carries", "[unit][security]") {
  const RecordAuth wrong("not-the-secret-of-this-job");
  CHECK(lspawn::describe_foreign_record(wrong.seal("k", bytes("evil\n42"))) ==
        "claiming 'evil pid 42' (43 bytes, sealed)");
}

TEST_CASE("record auth: a connection token checks with the same secret only", "[unit][security]") {
  const RecordAuth a("secret-one-0123456789"), b("secret-two-0123456789");
  const auto t = a.connection_token();
  CHECK(std::memcmp(t.data(), RecordAuth::kTokenMagic, 4) == 0);
  CHECK(a.check_connection_token(t));
  CHECK_FALSE(b.check_connection_token(t));                               // another secret
  CHECK(a.connection_token() != t);                                       // a fresh nonce each time
  for (size_t at : {size_t{0}, size_t{4}, RecordAuth::kTokenSize - 1}) {  // magic, nonce, MAC
    auto tampered = t;
    tampered[at] ^= 1;
    CHECK_FALSE(a.check_connection_token(tampered));
  }
  CHECK_FALSE(a.check_connection_token(RecordAuth::Token{}));
  CHECK(a.same_secret(RecordAuth("secret-one-0123456789")));
  CHECK_FALSE(a.same_secret(b));
  CHECK_FALSE(a.same_secret(RecordAuth("secret-one-01234567890")));  // a longer one with the same start
}
