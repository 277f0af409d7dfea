// DDP: PyTorch DistributedDataParallel semantics for workers started by `lspawn` (or any
// torchrun-compatible launcher, or lspawn::spawn), on DDP's own engine: c10d::Reducer.
//
//   - setup(): parameters are checked to match on every rank (count, shapes, dtypes), then
//     parameters and buffers are broadcast from rank 0 (c10d::broadcast_coalesced), then a
//     Reducer is built over the parameters that require grad, in buckets of bucket_cap_bytes
//     (25 MiB by default; the first bucket 1 MiB, as torch does), in reverse parameter order.
//   - training_step(): the reducer is told a forward starts (and rebuilds its buckets after the
//     first iteration in the order gradients became ready, as torch does); buffers are broadcast
//     from rank 0 first (broadcast_buffers); after the step the reducer is told a backward
//     follows, with the loss when find_unused_parameters (it then marks parameters the loss does
//     not reach as ready, so their bucket is not waited for forever).
//   - backward(): the reducer's autograd hooks copy each gradient into its bucket; a bucket's
//     all-reduce (sum, the gradients pre-divided by world size) starts as soon as its last
//     gradient is ready, overlapping the rest of backward; gradients hold the average when
//     backward() returns.
//   - no_sync (NoSync / set_gradient_sync(false)): backward passes accumulate locally; the first
//     synchronised backward after them reduces the accumulated gradients.
//   - gradient_as_bucket_view: after the first backward each gradient *is* a view of its slice of
//     the bucket (torch's DDP option of that name): no separate .grad tensors (one copy of the
//     gradients' memory saved) and no per-step copy into the buckets; the all-reduce averages
//     them in place. zero_grad() keeps them so: it zeroes the views in place, as Python's
//     optimizer.zero_grad(set_to_none=False) does. (LibTorch's Optimizer::zero_grad() cannot: it
//     detach_()es every gradient first, which throws "Can't detach views in-place" on 1.13 and
//     2.x.) The views move once, when the buckets are rebuilt at the second step; a gradient a
//     caller sets to none is copied into its bucket and made a view again by the next backward.
//
// The all-reduce goes through lspawn's all_reduce on a dedicated thread (a c10d comm hook, which
// keeps the overlap) when the group has shared memory (one node: shm; several nodes: the
// hierarchy, shm on each node and gloo among one leader per node) and the model is on the CPU
// (shm_comm_hook, on by default); else through the Group's c10d process group (gloo; NCCL for
// NCCL groups).
#pragma once

#include "strategies/parallel.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace c10d {
class Reducer;
}

namespace lspawn {
namespace detail {
class ShmHookWorker;  // ddp.cpp: the thread that runs the comm hook's bucket all-reduces
}

struct DDPOptions : ParallelOptions {
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  int64_t first_bucket_cap_bytes = 1024 * 1024;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  bool gradient_as_bucket_view = false;
  // Reduce buckets through lspawn's shared-memory all_reduce when the group has shm (its ranks
  // share a node, or, across nodes, the hierarchy: shm on each node, gloo among the node
  // leaders) and the model is on the CPU; otherwise through the group's process group.
  // On by default: 1.57x PyTorch DDP's steps/s at N = 2 where the gloo path gives 1.03x
  // (docs/benchmarks-training.md). False: always the process group, as torch's DDP.
  bool shm_comm_hook = true;
};

class DDP : public ParallelStrategy {
 public:
  explicit DDP(DDPOptions options = {});
  DDP(std::shared_ptr<Group> group, DDPOptions options = {}, int local_rank = -1);
  ~DDP() override;

  void setup(TrainingModule& module) override;
  void teardown() override;
  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override;
  void set_gradient_sync(bool enabled) override { sync_ = enabled; }
  bool gradient_sync() const { return sync_; }
  // gradient_as_bucket_view: gradients that are views of a bucket are zeroed in place and stay
  // views; optimizer.zero_grad() clears the others (it never sees the views). Otherwise
  // optimizer.zero_grad().
  void zero_grad(torch::optim::Optimizer& optimizer) override;

  const DDPOptions& ddp_options() const { return ddp_; }
  // Number of gradient buckets (after setup()).
  std::size_t num_buckets() const { return num_buckets_; }
  // True when buckets are reduced through the shm comm hook (one node or hierarchical), from
  // setup() until teardown().
  bool uses_shm_hook() const { return hook_worker_ != nullptr; }
  // The reducer's flat gradient buckets, in reduction order (empty before setup() or without
  // parameters that require grad). With gradient_as_bucket_view each such parameter's .grad is
  // a view of one of them once a backward pass has run (they change once, when the buckets are
  // rebuilt at the second step).
  std::vector<at::Tensor> bucket_buffers() const;

 private:
  void sync_buffers();
  DDPOptions ddp_;
  std::shared_ptr<c10d::Reducer> reducer_;
  std::vector<at::Tensor> buffers_;
  std::size_t num_buckets_ = 0;
  bool sync_ = true;
  // The comm hook's thread; the reducer's hook holds it too. teardown() stops it before the
  // reducer goes, so no bucket is still being reduced (or its future completed) meanwhile.
  std::shared_ptr<detail::ShmHookWorker> hook_worker_;
};

}  // namespace lspawn
