// Strategy: how a TrainingModule is trained across processes and devices (Lightning's Strategy
// 2.x API). The Trainer (strategies/trainer.hpp) drives one; a user may drive one by hand:
//
//   lspawn::DDP strategy;                       // workers started by `lspawn` / torchrun
//   strategy.setup_environment();               // join the job (process group, devices)
//   strategy.setup(*net);                       // model to device, DDP wrapping, precision
//   auto opt = net->configure_optimizers();
//   auto loader = strategy.process_dataloader(train);        // this rank's shard
//   for (...) { auto b = strategy.batch_to_device(loader.batch(i));
//               strategy.zero_grad(*opt); auto loss = strategy.training_step(b, i);
//               strategy.backward(loss); strategy.optimizer_step(*opt); }
//   strategy.teardown();
//
// Collective calls (barrier, broadcast, all_gather, reduce, reduce_boolean_decision) are made by
// every rank in the same order; on a single-process strategy they return their input.
// Errors: std::logic_error for a call out of order (e.g. training_step before setup()); the
// collectives' errors (collectives/error.hpp) for failures involving other ranks.
#pragma once

#include "collectives/reduce_op.hpp"
#include "strategies/accelerator.hpp"
#include "strategies/checkpoint.hpp"
#include "strategies/data.hpp"
#include "strategies/module.hpp"
#include "strategies/precision.hpp"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace lspawn {

class Strategy {
 public:
  virtual ~Strategy() = default;

  // --- lifecycle -------------------------------------------------------------------------------
  // Joins the job (distributed strategies: process group) and picks the device. Idempotent.
  virtual void setup_environment() = 0;
  // Moves the module to the root device and wraps it as the strategy needs (DDP: broadcast
  // from rank 0, reducer). Calls setup_environment() first when it has not run.
  virtual void setup(TrainingModule& module) = 0;
  // Releases what setup() made (reducer, threads); the process group stays until destruction.
  virtual void teardown() {}
  // Called by the Trainer when a step threw, before the exception propagates.
  virtual void on_exception(const std::exception& /*e*/) {}

  // --- placement -------------------------------------------------------------------------------
  virtual c10::Device root_device() const = 0;
  void model_to_device(TrainingModule& module) const;
  Batch batch_to_device(const Batch& batch) const;
  // This rank's view of `loader`: a DistributedSampler shard when world_size() > 1.
  virtual DataLoader process_dataloader(const DataLoader& loader) const;

  // --- ranks -----------------------------------------------------------------------------------
  virtual int global_rank() const { return 0; }
  virtual int local_rank() const { return 0; }
  virtual int node_rank() const { return 0; }
  virtual int world_size() const { return 1; }
  bool is_global_zero() const { return global_rank() == 0; }

  // --- collectives (Lightning names) -----------------------------------------------------------
  virtual void barrier(const std::string& /*name*/ = "") {}
  virtual c10::IValue broadcast(const c10::IValue& obj, int /*src*/ = 0) { return obj; }
  // (world_size, *tensor.shape). sync_grads: the result is differentiable, gradients flow back
  // to each rank's own slice (summed over ranks).
  virtual at::Tensor all_gather(const at::Tensor& tensor, bool /*sync_grads*/ = false) { return tensor.unsqueeze(0); }
  // Tensors: op over ranks (Mean or Sum); anything else passes through unchanged.
  virtual c10::IValue reduce(const c10::IValue& value, ReduceOp /*op*/ = ReduceOp::Mean) { return value; }
  // all=true: true only if every rank decided true; all=false: true if any rank did.
  virtual bool reduce_boolean_decision(bool decision, bool /*all*/ = true) { return decision; }

  // --- checkpoints -----------------------------------------------------------------------------
  // Global rank 0 writes `ckpt` to `path` atomically (checkpoint.hpp); other ranks do nothing.
  // Not a collective: callers that need the file on every rank add a barrier.
  void save_checkpoint(const Checkpoint& ckpt, const std::string& path) const;
  // Reads `path` on this rank (the file must be visible to every rank that loads it).
  Checkpoint load_checkpoint(const std::string& path) const;

  // --- steps -----------------------------------------------------------------------------------
  // Forward the module's steps under the precision plugin (and, for DDP, the reducer's
  // forward/backward preparation). Need setup().
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_idx);
  virtual StepMetrics validation_step(const Batch& batch, int64_t batch_idx);
  virtual StepMetrics test_step(const Batch& batch, int64_t batch_idx);
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);
  // loss.backward() through the precision plugin (DDP: gradients are averaged when it returns).
  virtual void backward(const at::Tensor& loss);
  // The optimizer step through the precision plugin. Returns false when it was skipped (16-mixed).
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer);
  // Clears the gradients of `optimizer`'s parameters before the next accumulation (the Trainer
  // calls it instead of optimizer.zero_grad()). Default: optimizer.zero_grad() — on 1.13 each
  // gradient is detach_()ed and zeroed in place, on 2.x detach_()ed and set to none. DDP with
  // gradient_as_bucket_view zeroes its bucket views in place instead (ddp.hpp).
  virtual void zero_grad(torch::optim::Optimizer& optimizer);
  // Gradient synchronisation of the next backward passes (DDP's no_sync()); no-op elsewhere.
  virtual void set_gradient_sync(bool /*enabled*/) {}
  // > 0: the Trainer feeds batches through a ParallelLoader prefetching this many (XLA).
  virtual int prefetch_batches() const { return 0; }

  PrecisionPlugin& precision_plugin();
  TrainingModule& module();
  bool is_setup() const { return module_ != nullptr; }

 protected:
  // For subclasses' setup(): remembers the module and builds the precision plugin.
  void attach(TrainingModule& module, Precision precision);
  TrainingModule* module_ = nullptr;
  std::optional<PrecisionPlugin> precision_;
};

// One process, one device (Lightning's SingleDeviceStrategy).
class SingleDevice : public Strategy {
 public:
  explicit SingleDevice(AcceleratorKind accelerator = AcceleratorKind::Auto, Precision precision = Precision::F32True)
      : kind_(accelerator), precision_kind_(precision) {}
  void setup_environment() override;
  void setup(TrainingModule& module) override;
  c10::Device root_device() const override;

 private:
  AcceleratorKind kind_;
  Precision precision_kind_;
  std::optional<Accelerator> accelerator_;
};

// RAII no_sync(): gradient synchronisation off for its lifetime (on for the backward after it).
class NoSync {
 public:
  explicit NoSync(Strategy& s) : s_(s) { s_.set_gradient_sync(false); }
  ~NoSync() { s_.set_gradient_sync(true); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  Strategy& s_;
};

}  // namespace lspawn
