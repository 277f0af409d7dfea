// Accelerator: the device one worker trains on (Lightning's CPUAccelerator / CUDAAccelerator).
//
//   auto acc = lspawn::Accelerator::choose(AcceleratorKind::Auto, env.local_rank);
//   module->to(acc.device());
//
// CUDA is used only when this LibTorch has it and a device is visible at run time
// (torch::cuda::is_available()); nothing is compiled differently for CUDA builds. The device of
// a worker is cuda:LOCAL_RANK (one process per device, as torchrun/Lightning do); a LOCAL_RANK
// beyond the visible devices is an error naming both numbers.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace lspawn {

enum class AcceleratorKind {
  Auto,  // CUDA when available at run time, else CPU
  Cpu,
  Cuda,  // std::invalid_argument at choose() when CUDA is not available
};
const char* to_string(AcceleratorKind k);
// "auto" | "cpu" | "cuda" (also "gpu"). Throws std::invalid_argument naming the value.
AcceleratorKind parse_accelerator(const std::string& name);

class Accelerator {
 public:
  // The accelerator of the worker with this local rank (see the header comment).
  static Accelerator choose(AcceleratorKind kind, int local_rank);
  static Accelerator cpu() { return Accelerator(c10::Device(c10::kCPU)); }

  const c10::Device& device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  // Makes device() the current device of this thread (CUDA only; nothing on CPU).
  void setup_device() const;
  // Number of devices of this kind visible to the process (CPU: 1).
  static int device_count(AcceleratorKind kind);

 private:
  explicit Accelerator(c10::Device d) : device_(d) {}
  c10::Device device_;
};

}  // namespace lspawn
