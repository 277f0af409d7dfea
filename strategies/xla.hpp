// XLA: the in-worker half of an XLA-like strategy (Lightning's TPUSpawnStrategy / XLAStrategy on
// torch_xla's calls), for CPU or CUDA devices over lspawn's collectives:
//   - all_gather(t) → (world, *t.shape), barrier(name) (xm.rendezvous: the name is checked
//     across ranks), reduce(x) → mean by default;
//   - optimizer_step(): like xm.optimizer_step — every gradient is all-reduced (one coalesced
//     all_reduce per dtype, mean over ranks) after backward, then the optimizer steps. No
//     overlap with backward (that is DDP's trick, not XLA's);
//   - batches come through a ParallelLoader (a thread that prefetches them onto the device),
//     as MpDeviceLoader does; the Trainer uses it when prefetch_batches() > 0;
//   - setup() broadcasts parameters and buffers from rank 0 (workers built from one
//     ModelWrapper already agree; this makes other starts agree too).
// The spawning half (index-first spawn, ModelWrapper, SerialExecutor) is XLASpawn
// (strategies/spawn_strategies.hpp).
#pragma once

#include "strategies/parallel.hpp"

namespace lspawn {

class XLA : public ParallelStrategy {
 public:
  explicit XLA(ParallelOptions options = {}, int prefetch = 2) : ParallelStrategy(options), prefetch_(prefetch) {}
  XLA(std::shared_ptr<Group> group, ParallelOptions options = {}, int local_rank = -1, int prefetch = 2)
      : ParallelStrategy(std::move(group), options, local_rank), prefetch_(prefetch) {}

  void setup(TrainingModule& module) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer) override;
  void set_gradient_sync(bool enabled) override { sync_ = enabled; }
  int prefetch_batches() const override { return prefetch_; }
  // Gradients of `optimizer`'s parameters averaged over ranks, in place (xm.reduce_gradients).
  void reduce_gradients(torch::optim::Optimizer& optimizer);

 private:
  int prefetch_;
  bool sync_ = true;
};

}  // namespace lspawn
