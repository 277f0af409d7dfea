// Accelerator: the device one worker trains on (Lightning's CPUAccelerator / CUDAAccelerator).
//
//   auto acc = lspawn::Accelerator::choose(AcceleratorKind::Auto, env.local_rank);
//   module->to(acc.device());
//
// CUDA is used only when this LibTorch has it and a device is visible at run time
// (torch::cuda::is_available()); nothing is compiled differently for CUDA builds. The device of
// a worker is cuda:LOCAL_RANK (one process per device, as torchrun/Lightning do, and as NCCL
// requires); a LOCAL_RANK beyond the visible devices is an error naming both numbers. When the
// collectives are not NCCL's (DeviceSharing::Allowed: LSPAWN_BACKEND=shm|gloo|auto or an explicit
// gloo/shm backend), several local ranks may share a device: cuda:(LOCAL_RANK mod devices), so
// 2 ranks train on one GPU.
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

// Whether local ranks beyond the visible devices share them (see the header comment).
enum class DeviceSharing { OnePerProcess, Allowed };

// The CUDA device index of `local_rank` among `count` visible devices: local_rank itself, or with
// Allowed local_rank mod count. Throws std::invalid_argument naming both numbers (and, for
// OnePerProcess, how to share) when there is none.
int cuda_device_index(int local_rank, int count, DeviceSharing sharing);

class Accelerator {
 public:
  // The accelerator of the worker with this local rank (see the header comment).
  static Accelerator choose(AcceleratorKind kind, int local_rank, DeviceSharing sharing = DeviceSharing::OnePerProcess);
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
