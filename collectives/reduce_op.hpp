// Reduction operations of lspawn collectives.
#pragma once

namespace lspawn {

// Sum, Mean, Min, Max, Product work on every dtype; the bitwise ops on integer and bool tensors.
//   Mean: the sum, divided by the group size. Floating types: true division. Integer types:
//         the sum divided with truncation toward zero (like torch.div(rounding_mode="trunc")).
//         Bool: not defined (throws).
//   Bool tensors: Sum and Max are "any", Product and Min are "all".
enum class ReduceOp { Sum, Mean, Min, Max, Product, BitwiseAnd, BitwiseOr, BitwiseXor };

const char* to_string(ReduceOp op);

}  // namespace lspawn
