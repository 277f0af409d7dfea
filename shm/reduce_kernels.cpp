#include "shm/reduce_kernels.hpp"

#include "shm/half.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace lspawn::shm {
namespace {

template <typename T>
struct SumOp {
  static T apply(T a, T b) { return a + b; }
};
template <typename T>
struct ProdOp {
  static T apply(T a, T b) { return a * b; }
};
template <typename T>
struct MinOp {
  static T apply(T a, T b) { return b < a ? b : a; }
};
template <typename T>
struct MaxOp {
  static T apply(T a, T b) { return a < b ? b : a; }
};
// Integer sum/product wrap around like LibTorch's (computed unsigned: no signed-overflow UB).
template <typename T>
struct WrapSumOp {
  using U = std::make_unsigned_t<T>;
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
};
template <typename T>
struct WrapProdOp {
  using U = std::make_unsigned_t<T>;
  static T apply(T a, T b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b))); }
};
template <typename T>
struct AndOp {
  static T apply(T a, T b) { return a & b; }
};
template <typename T>
struct OrOp {
  static T apply(T a, T b) { return a | b; }
};
template <typename T>
struct XorOp {
  static T apply(T a, T b) { return a ^ b; }
};

// Half types: compute in float, round once per step (what gloo does for float16).
template <typename H, template <typename> class Op>
struct HalfOp {
  static H apply(H a, H b) { return H(Op<float>::apply(static_cast<float>(a), static_cast<float>(b))); }
};

// Two-input pass over a block: d[i] = a[i] op b[i]. Plain loops the compiler vectorises.
template <typename T, typename Op>
void pass(T* d, const T* a, const T* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void fold(void* dst, const void* const* srcs, int nsrc, std::size_t count) {
  T* d = static_cast<T*>(dst);
  if (nsrc == 1) {
    if (dst != srcs[0]) std::memmove(d, srcs[0], count * sizeof(T));
    return;
  }
  // Blocks of 16 KiB keep the partial result in L1 while the later sources stream past it.
  constexpr std::size_t kBlock = 16384 / sizeof(T);
  for (std::size_t off = 0; off < count; off += kBlock) {
    const std::size_t n = std::min(kBlock, count - off);
    pass<T, Op>(d + off, static_cast<const T*>(srcs[0]) + off, static_cast<const T*>(srcs[1]) + off, n);
    for (int s = 2; s < nsrc; ++s) pass<T, Op>(d + off, d + off, static_cast<const T*>(srcs[s]) + off, n);
  }
}

template <typename T>
void arith(void* dst, const void* const* srcs, int nsrc, std::size_t count, KernelOp op) {
  switch (op) {
    case KernelOp::Sum: return fold<T, SumOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::Product: return fold<T, ProdOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::Min: return fold<T, MinOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::Max: return fold<T, MaxOp<T>>(dst, srcs, nsrc, count);
    default: break;
  }
  throw std::logic_error("shm reduce: bitwise op on a floating type");
}

template <typename T>
void integral(void* dst, const void* const* srcs, int nsrc, std::size_t count, KernelOp op) {
  switch (op) {
    case KernelOp::BitwiseAnd: return fold<T, AndOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::BitwiseOr: return fold<T, OrOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::BitwiseXor: return fold<T, XorOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::Sum: return fold<T, WrapSumOp<T>>(dst, srcs, nsrc, count);
    case KernelOp::Product: return fold<T, WrapProdOp<T>>(dst, srcs, nsrc, count);
    default: return arith<T>(dst, srcs, nsrc, count, op);
  }
}

template <typename H>
void half(void* dst, const void* const* srcs, int nsrc, std::size_t count, KernelOp op) {
  switch (op) {
    case KernelOp::Sum: return fold<H, HalfOp<H, SumOp>>(dst, srcs, nsrc, count);
    case KernelOp::Product: return fold<H, HalfOp<H, ProdOp>>(dst, srcs, nsrc, count);
    case KernelOp::Min: return fold<H, HalfOp<H, MinOp>>(dst, srcs, nsrc, count);
    case KernelOp::Max: return fold<H, HalfOp<H, MaxOp>>(dst, srcs, nsrc, count);
    default: break;
  }
  throw std::logic_error("shm reduce: bitwise op on a half type");
}

}  // namespace

std::size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::Float64:
    case ElemType::Int64: return 8;
    case ElemType::Float32:
    case ElemType::Int32: return 4;
    case ElemType::Float16:
    case ElemType::BFloat16: return 2;
    case ElemType::Int8:
    case ElemType::UInt8:
    case ElemType::Bool: return 1;
  }
  return 1;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::Float32: return "float32";
    case ElemType::Float64: return "float64";
    case ElemType::Float16: return "float16";
    case ElemType::BFloat16: return "bfloat16";
    case ElemType::Int8: return "int8";
    case ElemType::UInt8: return "uint8";
    case ElemType::Int32: return "int32";
    case ElemType::Int64: return "int64";
    case ElemType::Bool: return "bool";
  }
  return "?";
}

const char* kernel_op_name(KernelOp op) {
  switch (op) {
    case KernelOp::Sum: return "sum";
    case KernelOp::Product: return "product";
    case KernelOp::Min: return "min";
    case KernelOp::Max: return "max";
    case KernelOp::BitwiseAnd: return "bitwise_and";
    case KernelOp::BitwiseOr: return "bitwise_or";
    case KernelOp::BitwiseXor: return "bitwise_xor";
  }
  return "?";
}

bool kernel_supports(ElemType t, KernelOp op) {
  const bool bitwise = op == KernelOp::BitwiseAnd || op == KernelOp::BitwiseOr || op == KernelOp::BitwiseXor;
  if (!bitwise) return true;
  switch (t) {
    case ElemType::Float32:
    case ElemType::Float64:
    case ElemType::Float16:
    case ElemType::BFloat16: return false;
    default: return true;
  }
}

void reduce_into(void* dst, const void* const* srcs, int nsrc, std::size_t count, ElemType t, KernelOp op) {
  if (count == 0) return;
  if (t == ElemType::Bool) {
    // 0/1 bytes: sum and max are "any", product and min are "all"; xor is parity.
    switch (op) {
      case KernelOp::Sum:
      case KernelOp::Max: op = KernelOp::BitwiseOr; break;
      case KernelOp::Product:
      case KernelOp::Min: op = KernelOp::BitwiseAnd; break;
      default: break;
    }
    return integral<std::uint8_t>(dst, srcs, nsrc, count, op);
  }
  switch (t) {
    case ElemType::Float32: return arith<float>(dst, srcs, nsrc, count, op);
    case ElemType::Float64: return arith<double>(dst, srcs, nsrc, count, op);
    case ElemType::Float16: return half<Float16>(dst, srcs, nsrc, count, op);
    case ElemType::BFloat16: return half<BFloat16>(dst, srcs, nsrc, count, op);
    case ElemType::Int8: return integral<std::int8_t>(dst, srcs, nsrc, count, op);
    case ElemType::UInt8: return integral<std::uint8_t>(dst, srcs, nsrc, count, op);
    case ElemType::Int32: return integral<std::int32_t>(dst, srcs, nsrc, count, op);
    case ElemType::Int64: return integral<std::int64_t>(dst, srcs, nsrc, count, op);
    case ElemType::Bool: break;
  }
}

}  // namespace lspawn::shm
