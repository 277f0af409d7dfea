#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>

#include "supervisor/job_secret.hpp"

TEST_CASE("job secret: 64 hex digits from getrandom, different every time", "[security]") {
  std::set<std::string> seen;
  for (int i = 0; i < 16; ++i) {
    const auto s = lspawn::generate_job_secret();
    CHECK(s.size() == 64);
    CHECK(s.find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(s);
  }
  CHECK(seen.size() == 16);
}

TEST_CASE("job secret: lspawn's own LSPAWN_JOB_SECRET is used - a short one is refused unseen", "[security]") {
  ::unsetenv("LSPAWN_JOB_SECRET");
  CHECK_FALSE(lspawn::job_secret_from_environment());
  ::setenv("LSPAWN_JOB_SECRET", "a-secret-shared-by-every-node", 1);
  CHECK(lspawn::job_secret_from_environment() == std::string("a-secret-shared-by-every-node"));
  ::setenv("LSPAWN_JOB_SECRET", "tiny", 1);
  try {
    lspawn::job_secret_from_environment();
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("too short (4 characters") != std::string::npos);
    CHECK(std::string(e.what()).find("tiny") == std::string::npos);
  }
  ::unsetenv("LSPAWN_JOB_SECRET");
}
