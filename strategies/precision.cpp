#include "strategies/precision.hpp"

#include "runtime/torch_compat.hpp"

#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>

namespace lspawn {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::F32True: return "32-true";
    case Precision::Bf16Mixed: return "bf16-mixed";
    case Precision::F16Mixed: return "16-mixed";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "32-true" || name == "32" || name.empty()) return Precision::F32True;
  if (name == "bf16-mixed" || name == "bf16") return Precision::Bf16Mixed;
  if (name == "16-mixed" || name == "16") return Precision::F16Mixed;
  throw std::invalid_argument("unknown precision '" + name + "' (expected 32-true, bf16-mixed or 16-mixed)");
}

AutocastScope::AutocastScope(at::DeviceType type, bool enabled, at::ScalarType dtype)
    : type_(type),
      prev_enabled_(compat::autocast_enabled(type)),
      prev_dtype_(compat::autocast_dtype(type)),
      active_(enabled) {
  if (!active_) return;
  compat::set_autocast(type_, true, dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast(type_, prev_enabled_, prev_dtype_);
}

PrecisionPlugin::PrecisionPlugin(Precision precision, c10::Device device) : precision_(precision), device_(device) {
  if (precision_ == Precision::F16Mixed) {
    if (!device_.is_cuda()) {
      throw std::invalid_argument(
          std::string("precision '16-mixed' needs a CUDA device (gradient scaling of float16 is "
                      "only supported there); this worker's device is ") +
          device_.str() + ": use 'bf16-mixed' or '32-true' on CPU");
    }
    scale_ = at::full({1}, 65536.0, at::TensorOptions().dtype(at::kFloat).device(device_));
    growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device_));
  }
}

AutocastScope PrecisionPlugin::forward_context() const {
  switch (precision_) {
    case Precision::F32True: return AutocastScope(device_.type(), false, at::kFloat);
    case Precision::Bf16Mixed: return AutocastScope(device_.type(), true, at::kBFloat16);
    case Precision::F16Mixed: return AutocastScope(device_.type(), true, at::kHalf);
  }
  return AutocastScope(device_.type(), false, at::kFloat);
}

void PrecisionPlugin::backward(const at::Tensor& loss) {
  if (precision_ == Precision::F16Mixed) {
    torch::autograd::backward({loss.to(at::kFloat) * scale_});
  } else {
    torch::autograd::backward({loss});
  }
}

bool PrecisionPlugin::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (precision_ != Precision::F16Mixed) {
    optimizer.step();
    return true;
  }
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) grads.push_back(p.grad());
  auto found_inf = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  const auto inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  const bool finite = found_inf.item<float>() == 0.0f;
  if (finite) optimizer.step();
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf, 2.0, 0.5, 2000);
  return finite;
}

double PrecisionPlugin::loss_scale() const { return scale_.defined() ? scale_.item<double>() : 1.0; }

}  // namespace lspawn
