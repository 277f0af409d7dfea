// Element-wise reduction kernels used by the shared-memory backend. No LibTorch here: the
// kernels see raw buffers, an element type and an operation, so that they compile at -O3 with
// auto-vectorisation and stay testable on their own.
//
// Order: every kernel folds its inputs strictly left to right (`srcs[0] op srcs[1] op …`), so a
// caller that passes the ranks' buffers in rank order gets the same bits on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lspawn::shm {

// The element types the shm backend reduces. Bool is reduced as a byte holding 0 or 1.
enum class ElemType : std::uint8_t {
  Float32,
  Float64,
  Float16,
  BFloat16,
  Int8,
  UInt8,
  Int32,
  Int64,
  Bool,
};

// The operations the kernels implement. Mean is not here: the caller sums, then divides.
enum class KernelOp : std::uint8_t { Sum, Product, Min, Max, BitwiseAnd, BitwiseOr, BitwiseXor };

std::size_t elem_size(ElemType t);
const char* elem_name(ElemType t);
const char* kernel_op_name(KernelOp op);

// True when `op` is defined on `t` (bitwise ops only on integer and bool types).
bool kernel_supports(ElemType t, KernelOp op);

// dst[i] = srcs[0][i] op srcs[1][i] op … op srcs[nsrc-1][i] for i in [0, count).
// `dst` may alias srcs[0] (and only srcs[0]). nsrc >= 1. Precondition: kernel_supports(t, op).
void reduce_into(void* dst, const void* const* srcs, int nsrc, std::size_t count, ElemType t, KernelOp op);

}  // namespace lspawn::shm
