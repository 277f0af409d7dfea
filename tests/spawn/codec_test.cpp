#include <catch2/catch.hpp>

#include "spawn/codec.hpp"
#include "proto/wire.hpp"

using lspawn::Codec;
using lspawn::CodecError;

namespace {
template <class T>
T round_trip(const T& x) {
  // Through the wire, as a result frame: what a child sends back.
  lspawn::proto::SpawnResult sent;
  sent.value = Codec<T>::encode(x);
  std::string frame = lspawn::wire::encode_frame(sent);
  lspawn::proto::SpawnResult back;
  REQUIRE(lspawn::wire::try_decode_frame(frame, back, "codec test"));
  return Codec<T>::decode(back.value);
}
enum class Color : uint8_t { Red = 1, Blue = 200 };
}  // namespace

TEST_CASE("codec round-trips scalars, strings and containers") {
  CHECK(round_trip(true) == true);
  CHECK(round_trip(false) == false);
  CHECK(round_trip(-42) == -42);
  CHECK(round_trip(int64_t{1} << 62) == int64_t{1} << 62);
  CHECK(round_trip(uint16_t{65535}) == 65535);
  CHECK(round_trip(2.5) == 2.5);
  CHECK(round_trip(1.5f) == 1.5f);
  CHECK(round_trip(std::string("run\0x", 5)) == std::string("run\0x", 5));
  CHECK(round_trip(std::vector<int>{1, 2, 3}) == std::vector<int>{1, 2, 3});
  CHECK(round_trip(std::vector<bool>{true, false}) == std::vector<bool>{true, false});
  CHECK(round_trip(std::vector<std::string>{}).empty());
  CHECK(round_trip(std::vector<std::vector<double>>{{1.0}, {}, {2.0, 3.0}}) ==
        std::vector<std::vector<double>>{{1.0}, {}, {2.0, 3.0}});
  CHECK(round_trip(std::make_tuple(1, std::string("a"), 0.5)) == std::make_tuple(1, std::string("a"), 0.5));
  CHECK(round_trip(std::make_pair(std::string("k"), 7)) == std::make_pair(std::string("k"), 7));
  CHECK(round_trip(std::optional<int>()) == std::nullopt);
  CHECK(round_trip(std::optional<int>(3)) == 3);
  CHECK(round_trip(std::map<std::string, int>{{"a", 1}, {"b", 2}}) == std::map<std::string, int>{{"a", 1}, {"b", 2}});
  CHECK(round_trip(Color::Blue) == Color::Blue);
}

TEST_CASE("codec rejects a value of the wrong kind, naming both kinds") {
  const auto v = Codec<std::string>::encode("x");
  CHECK_THROWS_WITH(Codec<int>::decode(v),
                    Catch::Contains("expected a value of kind int64") && Catch::Contains("got string"));
  CHECK_THROWS_AS(Codec<std::vector<int>>::decode(v), CodecError);
  lspawn::proto::Value empty;
  CHECK_THROWS_WITH(Codec<bool>::decode(empty), Catch::Contains("got nothing"));
}

TEST_CASE("codec range-checks integers on decode") {
  const auto big = Codec<int64_t>::encode(int64_t{1} << 40);
  CHECK_THROWS_WITH(Codec<int32_t>::decode(big), Catch::Contains("does not fit"));
  const auto neg = Codec<int>::encode(-1);
  CHECK_THROWS_AS(Codec<unsigned>::decode(neg), CodecError);
  CHECK_THROWS_AS(Codec<uint64_t>::encode(~uint64_t{0}), CodecError);
}

TEST_CASE("codec rejects tuples of the wrong arity") {
  const auto two = Codec<std::tuple<int, int>>::encode({1, 2});
  CHECK_THROWS_WITH((Codec<std::tuple<int, int, int>>::decode(two)),
                    Catch::Contains("tuple of 3 elements expected, got a list of 2"));
}

TEST_CASE("has_codec tells supported types from the rest at compile time") {
  STATIC_REQUIRE(lspawn::has_codec<int>::value);
  STATIC_REQUIRE(lspawn::has_codec<std::vector<std::string>>::value);
  STATIC_REQUIRE(lspawn::has_codec<std::tuple<int, std::optional<double>>>::value);
  STATIC_REQUIRE_FALSE(lspawn::has_codec<int*>::value);
  STATIC_REQUIRE_FALSE(lspawn::has_codec<std::FILE*>::value);
}
