#include "strategies/xla.hpp"

#include "collectives/ops.hpp"

#include <torch/csrc/autograd/grad_mode.h>

#include <map>

namespace lspawn {

void XLA::setup(TrainingModule& module) {
  setup_environment();
  model_to_device(module);
  attach(module, options_.precision);
  at::NoGradGuard no_grad;
  for (auto& p : module.parameters(true)) lspawn::broadcast(group(), p, 0);
  for (auto& b : module.buffers(true)) lspawn::broadcast(group(), b, 0);
}

void XLA::reduce_gradients(torch::optim::Optimizer& optimizer) {
  if (world_size() == 1) return;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) by_dtype[p.grad().scalar_type()].push_back(p.grad());
  at::NoGradGuard no_grad;
  for (auto& [dtype, grads] : by_dtype) lspawn::all_reduce_coalesced(group(), grads, ReduceOp::Mean);
}

bool XLA::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (sync_) reduce_gradients(optimizer);
  return Strategy::optimizer_step(optimizer);
}

}  // namespace lspawn
