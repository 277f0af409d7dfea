// Stand-in for a LibTorch header that Debian's libtorch-dev 1.13 does not ship, although its
// torch/csrc/distributed/c10d/reducer.hpp includes it (the library itself has the code).
// reducer.hpp only needs the ContextPtr type (a shared_ptr member of Reducer::RpcContext, whose
// layout does not depend on the pointee) and DistAutogradContext::GradCallback (a static_assert).
// This class declares nothing else: no member, no virtual, so no symbol of it is emitted here and
// nothing in lspawn touches a DistAutogradContext (only LibTorch's own code creates one). strategies/CMakeLists.txt adds this directory to the
// include path only when the real header is missing (PyPI's LibTorch 2.x ships it).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {
class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;
}  // namespace autograd
}  // namespace distributed
}  // namespace torch
