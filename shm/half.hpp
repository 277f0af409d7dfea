// IEEE binary16 (float16) and bfloat16 as 16-bit storage types converted through float, bit for
// bit as LibTorch's c10::Half and c10::BFloat16 convert (round to nearest even; c10's NaN for
// bfloat16), so that the shm kernels give the bits gloo and LibTorch give without linking c10.
// The conversions are Maratos' FP16 library's (MIT), which c10 uses too.
#pragma once

#include <cstdint>
#include <cstring>

namespace lspawn::shm {

namespace half_detail {
inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace half_detail

struct Float16 {
  std::uint16_t x;
  Float16() = default;
  explicit Float16(float f) : x(from_float(f)) {}
  explicit operator float() const { return to_float(x); }

  static float to_float(std::uint16_t h) {
    using namespace half_detail;
    const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
    const std::uint32_t sign = w & UINT32_C(0x80000000);
    const std::uint32_t two_w = w + w;
    const std::uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = from_bits(UINT32_C(0x7800000));
    const float normalized = from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const std::uint32_t magic_mask = UINT32_C(126) << 23;
    const float magic_bias = 0.5f;
    const float denormalized = from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const std::uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const std::uint32_t result = sign | (two_w < denormalized_cutoff ? bits(denormalized) : bits(normalized));
    return from_bits(result);
  }

  static std::uint16_t from_float(float f) {
    using namespace half_detail;
    const float scale_to_inf = from_bits(UINT32_C(0x77800000));
    const float scale_to_zero = from_bits(UINT32_C(0x08800000));
    const float abs_f = from_bits(bits(f) & UINT32_C(0x7FFFFFFF));
    float base = (abs_f * scale_to_inf) * scale_to_zero;
    const std::uint32_t w = bits(f);
    const std::uint32_t shl1_w = w + w;
    const std::uint32_t sign = w & UINT32_C(0x80000000);
    std::uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const std::uint32_t b = bits(base);
    const std::uint32_t exp_bits = (b >> 13) & UINT32_C(0x00007C00);
    const std::uint32_t mantissa_bits = b & UINT32_C(0x00000FFF);
    const std::uint32_t nonsign = exp_bits + mantissa_bits;
    return static_cast<std::uint16_t>((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
  }
};

struct BFloat16 {
  std::uint16_t x;
  BFloat16() = default;
  explicit BFloat16(float f) : x(from_float(f)) {}
  explicit operator float() const { return half_detail::from_bits(static_cast<std::uint32_t>(x) << 16); }

  static std::uint16_t from_float(float f) {
    if (f != f) return UINT16_C(0x7FC0);  // c10: every NaN becomes the canonical quiet NaN
    const std::uint32_t u = half_detail::bits(f);
    const std::uint32_t rounding_bias = ((u >> 16) & 1) + UINT32_C(0x7FFF);
    return static_cast<std::uint16_t>((u + rounding_bias) >> 16);
  }
};

static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2, "16-bit storage types");

}  // namespace lspawn::shm
