// PrecisionPlugin: how forward, backward and the optimizer step treat numeric precision
// (Lightning's `precision=` flag).
//
//   "32-true"     fp32 everywhere (default).
//   "bf16-mixed"  forward under autocast to bfloat16 (CPU and CUDA); parameters, gradients and
//                 the optimizer stay fp32.
//   "16-mixed"    forward under autocast to float16 and a dynamic gradient scaler (the loss is
//                 multiplied by the scale before backward; gradients are unscaled and checked
//                 for inf/NaN before the step, which is skipped when any is found; the scale
//                 halves on a skip and doubles after 2000 clean steps). CUDA only: asking for it
//                 on a CPU device throws std::invalid_argument (as Lightning does).
//
//   PrecisionPlugin p(Precision::Bf16Mixed, device);
//   at::Tensor loss;
//   { auto scope = p.forward_context(); loss = module->training_step(batch, i); }
//   p.backward(loss);
//   p.optimizer_step(optimizer);
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <string>

namespace lspawn {

enum class Precision { F32True, Bf16Mixed, F16Mixed };
const char* to_string(Precision p);  // "32-true" | "bf16-mixed" | "16-mixed"
// Accepts the names above (and "32", "bf16", "16"). Throws std::invalid_argument naming the value.
Precision parse_precision(const std::string& name);

// Restores the autocast state it found (enabled flag, dtype, nesting) when destroyed.
class AutocastScope {
 public:
  AutocastScope(at::DeviceType type, bool enabled, at::ScalarType dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  at::DeviceType type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
  bool active_;
};

class PrecisionPlugin {
 public:
  // Throws std::invalid_argument for 16-mixed on a non-CUDA device.
  PrecisionPlugin(Precision precision, c10::Device device);

  Precision precision() const { return precision_; }
  // Autocast for the forward pass (a no-op scope for 32-true).
  AutocastScope forward_context() const;
  // loss.backward(), scaled for 16-mixed.
  void backward(const at::Tensor& loss);
  // 16-mixed: unscale, skip on inf/NaN, update the scale. Else optimizer.step().
  // Returns false when the step was skipped.
  bool optimizer_step(torch::optim::Optimizer& optimizer);
  // Current loss scale (1 unless 16-mixed).
  double loss_scale() const;

 private:
  Precision precision_;
  c10::Device device_;
  at::Tensor scale_;           // 16-mixed: float32 (1,) on the device
  at::Tensor growth_tracker_;  // 16-mixed: int32 (1,) on the device
};

}  // namespace lspawn
