#include <catch2/catch.hpp>

#include "spawn/registry.hpp"

namespace {
std::string greet(int index, std::string name, std::vector<int> xs) {
  int sum = 0;
  for (int x : xs) sum += x;
  return name + std::to_string(index) + ":" + std::to_string(sum);
}
void nothing(long) {}
}  // namespace
LSPAWN_REGISTER(greet);
LSPAWN_REGISTER(nothing);

TEST_CASE("registered functions are found by name and by address") {
  auto& reg = lspawn::FunctionRegistry::global();
  REQUIRE(reg.find("greet") != nullptr);
  CHECK(reg.find("missing") == nullptr);
  CHECK(reg.name_of(reinterpret_cast<lspawn::FunctionAddress>(&greet)) == "greet");
  CHECK(reg.name_of(reinterpret_cast<lspawn::FunctionAddress>(&nothing)) == "nothing");
  CHECK_THAT(reg.names(), Catch::Contains("greet") && Catch::Contains("nothing"));
}

TEST_CASE("an invoker decodes the arguments, passes the index first and encodes the result") {
  const lspawn::Invoker& inv = *lspawn::FunctionRegistry::global().find("greet");
  const auto args = lspawn::encode_args(std::make_tuple(std::string("w"), std::vector<int>{1, 2}));
  const auto out = inv(5, args);
  REQUIRE(out);
  CHECK(lspawn::Codec<std::string>::decode(*out) == "w5:3");
  const auto none = (*lspawn::FunctionRegistry::global().find("nothing"))(0, {});
  CHECK_FALSE(none);
}

TEST_CASE("an invoker rejects a wrong argument count or type with a clear error") {
  const lspawn::Invoker& inv = *lspawn::FunctionRegistry::global().find("greet");
  CHECK_THROWS_WITH(inv(0, lspawn::encode_args(std::make_tuple(std::string("w")))),
                    Catch::Contains("carries 1 arguments") && Catch::Contains("takes 2"));
  CHECK_THROWS_WITH(inv(0, lspawn::encode_args(std::make_tuple(1, 2))),
                    Catch::Contains("expected a value of kind string"));
}

TEST_CASE("registering a second function under a taken name is refused") {
  auto& reg = lspawn::FunctionRegistry::global();
  CHECK_THROWS_WITH(
      reg.add("greet", reinterpret_cast<lspawn::FunctionAddress>(&nothing), lspawn::make_invoker(&nothing)),
      Catch::Contains("already registered"));
}
