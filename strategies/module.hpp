// TrainingModule: what the user writes (Lightning's LightningModule, reduced to its C++ core).
//
//   struct Net : lspawn::TrainingModule {
//     Net() { fc = register_module("fc", torch::nn::Linear(64, 10)); }
//     at::Tensor training_step(const lspawn::Batch& b, int64_t) override {
//       return at::cross_entropy_loss(fc(b[0]), b[1]); }
//     std::shared_ptr<torch::optim::Optimizer> configure_optimizers() override { ... }
//     torch::nn::Linear fc{nullptr};
//   };
//
// The strategy calls the *_step methods (through Strategy::training_step etc., which wrap them
// the way DDP wraps forward); the module never talks to other ranks itself.
#pragma once

#include "strategies/data.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace lspawn {

// Named scalar metrics of one step (e.g. {"loss", l}, {"acc", a}); averaged over samples by the trainer.
using StepMetrics = std::map<std::string, at::Tensor>;

class TrainingModule : public torch::nn::Module {
 public:
  // The loss of one training batch (a scalar that requires grad).
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  // Metrics of one validation / test batch (scalars, means over the batch). Default: none.
  virtual StepMetrics validation_step(const Batch& /*batch*/, int64_t /*batch_idx*/) { return {}; }
  virtual StepMetrics test_step(const Batch& batch, int64_t batch_idx) { return validation_step(batch, batch_idx); }
  // Predictions of one batch (rows along dim 0). Default: std::logic_error.
  virtual at::Tensor predict_step(const Batch& /*batch*/, int64_t /*batch_idx*/) {
    throw std::logic_error("TrainingModule::predict_step is not implemented by this module");
  }
  // The optimizer over this module's parameters, created after the strategy's setup() (so it
  // sees the parameters on their device).
  virtual std::shared_ptr<torch::optim::Optimizer> configure_optimizers() = 0;
  // A new module of the same architecture (any initial weights), for DataParallel over several
  // devices: it copies this module's parameters and buffers into each replica (names, shapes and
  // dtypes must match) before every step. Copy here the plain members a step reads.
  //   std::shared_ptr<lspawn::TrainingModule> make_replica() const override { return std::make_shared<Net>(); }
  // Default: std::logic_error (only DataParallel with more than one device calls it).
  virtual std::shared_ptr<TrainingModule> make_replica() const {
    throw std::logic_error(
        "DataParallel over several devices needs TrainingModule::make_replica() (a new module of "
        "the same architecture); " +
        name() + " does not override it");
  }
};

}  // namespace lspawn
