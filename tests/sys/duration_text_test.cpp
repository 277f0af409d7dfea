// sys/duration_text.hpp: the one way lspawn's messages write durations.
#include <catch2/catch.hpp>

#include "sys/duration_text.hpp"

using namespace std::chrono_literals;

TEST_CASE("seconds_text: a set value as given, at most three decimals, no trailing zeros", "[duration_text]") {
  CHECK(lspawn::seconds_text(30s) == "30 s");
  CHECK(lspawn::seconds_text(2500ms) == "2.5 s");
  CHECK(lspawn::seconds_text(125ms) == "0.125 s");
  CHECK(lspawn::seconds_text(0ms) == "0 s");
  CHECK(lspawn::seconds_text(std::chrono::microseconds(1250400)) == "1.25 s");
  CHECK(lspawn::seconds_number(200ms) == "0.2");  // as the flag takes it: "(--hang-timeout 0.2)"
  CHECK(lspawn::seconds_number(600s) == "600");
}

TEST_CASE("elapsed_text: two significant digits under a second, one decimal under 10 s, then whole seconds",
          "[duration_text]") {
  CHECK(lspawn::elapsed_text(12ms) == "0.012 s");
  CHECK(lspawn::elapsed_text(400ms) == "0.4 s");
  CHECK(lspawn::elapsed_text(2s) == "2.0 s");
  CHECK(lspawn::elapsed_text(7040ms) == "7.0 s");
  CHECK(lspawn::elapsed_text(41s) == "41 s");
  CHECK(lspawn::elapsed_text(-3s) == "0 s");
}
