// shm/half.hpp converts float16 and bfloat16 bit for bit as c10::Half and c10::BFloat16 do (the shm
// kernels' half-type reductions give LibTorch's and gloo's bits without linking c10): every one of
// the 65,536 16-bit patterns to float, and ~4.2 million float patterns (every 1021st, with every
// special value) to 16 bits.
#include "shm/half.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Equal bits, or both NaN (c10 may keep a NaN's payload where IEEE leaves it open).
bool same(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }
}  // namespace

TEST_CASE("float16 and bfloat16 to float: all 65,536 patterns as c10", "[shm][half][unit]") {
  int bad16 = 0, badbf = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float mine16 = lspawn::shm::Float16::to_float(static_cast<std::uint16_t>(h));
    const float theirs16 = static_cast<float>(c10::Half(static_cast<std::uint16_t>(h), c10::Half::from_bits()));
    bad16 += !same(mine16, theirs16);
    lspawn::shm::BFloat16 b;
    b.x = static_cast<std::uint16_t>(h);
    const float theirsbf = static_cast<float>(c10::BFloat16(static_cast<std::uint16_t>(h), c10::BFloat16::from_bits()));
    badbf += !same(static_cast<float>(b), theirsbf);
  }
  CHECK(bad16 == 0);
  CHECK(badbf == 0);
}

TEST_CASE("float to float16 and bfloat16: rounding, overflow, subnormals and NaN as c10", "[shm][half][unit]") {
  std::vector<std::uint32_t> patterns = {0,           0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                         0x477fe000u, 0x477ff000u, 0x33800000u, 0x33000000u, 0x38800000u, 0x00000001u};
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 1021) patterns.push_back(static_cast<std::uint32_t>(u));
  int bad16 = 0, badbf = 0;
  for (std::uint32_t u : patterns) {
    const float f = from(u);
    bad16 += lspawn::shm::Float16(f).x != c10::Half(f).x;
    const std::uint16_t mine = lspawn::shm::BFloat16(f).x;
    const std::uint16_t theirs = c10::BFloat16(f).x;
    badbf += !(mine == theirs || (std::isnan(f) && (mine & 0x7f80) == 0x7f80 && (mine & 0x7f) && (theirs & 0x7f)));
  }
  CHECK(bad16 == 0);
  CHECK(badbf == 0);
}
