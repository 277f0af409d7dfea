#include "strategies/strategy.hpp"

#include <torch/csrc/autograd/grad_mode.h>

#include <stdexcept>

namespace lspawn {

void Strategy::model_to_device(TrainingModule& module) const { module.to(root_device()); }

Batch Strategy::batch_to_device(const Batch& batch) const {
  Batch out;
  out.reserve(batch.size());
  const auto device = root_device();
  for (const auto& t : batch) out.push_back(t.defined() ? t.to(device, /*non_blocking=*/true) : t);
  return out;
}

DataLoader Strategy::process_dataloader(const DataLoader& loader) const {
  if (world_size() <= 1) return loader;
  return loader.distributed(global_rank(), world_size());
}

void Strategy::save_checkpoint(const Checkpoint& ckpt, const std::string& path) const {
  if (!is_global_zero()) return;
  write_checkpoint_file(ckpt, path);
}

Checkpoint Strategy::load_checkpoint(const std::string& path) const { return read_checkpoint_file(path); }

void Strategy::attach(TrainingModule& module, Precision precision) {
  precision_.emplace(precision, root_device());
  module_ = &module;
}

PrecisionPlugin& Strategy::precision_plugin() {
  if (!precision_) throw std::logic_error("Strategy: setup() has not been called");
  return *precision_;
}

TrainingModule& Strategy::module() {
  if (!module_) throw std::logic_error("Strategy: setup() has not been called (no module)");
  return *module_;
}

at::Tensor Strategy::training_step(const Batch& batch, int64_t batch_idx) {
  auto& m = module();
  auto scope = precision_plugin().forward_context();
  return m.training_step(batch, batch_idx);
}

StepMetrics Strategy::validation_step(const Batch& batch, int64_t batch_idx) {
  auto& m = module();
  torch::NoGradGuard no_grad;
  auto scope = precision_plugin().forward_context();
  return m.validation_step(batch, batch_idx);
}

StepMetrics Strategy::test_step(const Batch& batch, int64_t batch_idx) {
  auto& m = module();
  torch::NoGradGuard no_grad;
  auto scope = precision_plugin().forward_context();
  return m.test_step(batch, batch_idx);
}

at::Tensor Strategy::predict_step(const Batch& batch, int64_t batch_idx) {
  auto& m = module();
  torch::NoGradGuard no_grad;
  auto scope = precision_plugin().forward_context();
  return m.predict_step(batch, batch_idx);
}

void Strategy::backward(const at::Tensor& loss) { precision_plugin().backward(loss); }

bool Strategy::optimizer_step(torch::optim::Optimizer& optimizer) {
  return precision_plugin().optimizer_step(optimizer);
}

void Strategy::zero_grad(torch::optim::Optimizer& optimizer) { optimizer.zero_grad(); }

void SingleDevice::setup_environment() {
  if (!accelerator_) accelerator_ = Accelerator::choose(kind_, 0);
  accelerator_->setup_device();
}

c10::Device SingleDevice::root_device() const {
  return accelerator_ ? accelerator_->device() : Accelerator::choose(kind_, 0).device();
}

void SingleDevice::setup(TrainingModule& module) {
  setup_environment();
  model_to_device(module);
  attach(module, precision_kind_);
}

}  // namespace lspawn
