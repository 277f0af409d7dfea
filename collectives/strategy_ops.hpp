// The collective calls a training Strategy makes (the shape of Lightning's Strategy API), over an
// lspawn::Group. Strategies (DDP, XLA-like spawn, data-parallel) call these and nothing else.
//
//   StrategyCollectives c(group);
//   at::Tensor all = c.all_gather(batch_metric);          // (world_size, *batch_metric.shape)
//   c10::IValue loss = c.reduce(loss_value, ReduceOp::Mean);
//   c10::IValue cfg  = c.broadcast(config_dict, 0);
//   bool stop = c.reduce_boolean_decision(should_stop);   // all ranks must agree to stop
//   c.barrier("after_checkpoint");
#pragma once

#include "collectives/group.hpp"
#include "collectives/reduce_op.hpp"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>

namespace lspawn {

class StrategyCollectives {
 public:
  // Shares ownership of the group; every rank of it must make the same calls in the same order.
  explicit StrategyCollectives(std::shared_ptr<Group> group) : group_(std::move(group)) {}

  int rank() const { return group_->rank(); }
  int world_size() const { return group_->size(); }
  Group& group() { return *group_; }

  // Stacked gather: (world_size, *tensor.shape). The input is not modified.
  at::Tensor all_gather(const at::Tensor& tensor);
  // A tensor: a new tensor, op over ranks (the input is not modified). Anything else (a number,
  // a string, None…) passes through unchanged, as in Lightning.
  c10::IValue reduce(const c10::IValue& value, ReduceOp op = ReduceOp::Mean);
  // Any picklable value from `src` to all.
  c10::IValue broadcast(const c10::IValue& value, int src = 0);
  bool reduce_boolean_decision(bool decision, bool all = true);
  // Waits for all ranks. The name is checked: ranks at barriers of different names get
  // CollectiveMismatch naming them (a frequent bug: one rank skipped a barrier).
  void barrier(const std::string& name = "");

 private:
  std::shared_ptr<Group> group_;
};

}  // namespace lspawn
