#include "strategies/accelerator.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <stdexcept>

namespace lspawn {

const char* to_string(AcceleratorKind k) {
  switch (k) {
    case AcceleratorKind::Auto: return "auto";
    case AcceleratorKind::Cpu: return "cpu";
    case AcceleratorKind::Cuda: return "cuda";
  }
  return "?";
}

AcceleratorKind parse_accelerator(const std::string& name) {
  if (name == "auto" || name.empty()) return AcceleratorKind::Auto;
  if (name == "cpu") return AcceleratorKind::Cpu;
  if (name == "cuda" || name == "gpu") return AcceleratorKind::Cuda;
  throw std::invalid_argument("unknown accelerator '" + name + "' (expected auto, cpu or cuda)");
}

int Accelerator::device_count(AcceleratorKind kind) {
  if (kind == AcceleratorKind::Cpu) return 1;
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

int cuda_device_index(int local_rank, int count, DeviceSharing sharing) {
  if (local_rank >= 0 && count > 0 && sharing == DeviceSharing::Allowed) return local_rank % count;
  if (local_rank >= 0 && local_rank < count) return local_rank;
  throw std::invalid_argument("LOCAL_RANK " + std::to_string(local_rank) +
                              " has no CUDA device: " + std::to_string(count) + " visible (one process per device" +
                              (sharing == DeviceSharing::OnePerProcess
                                   ? std::string(", as NCCL requires; LSPAWN_BACKEND=shm or gloo lets ranks share one)")
                                   : std::string(")")));
}

Accelerator Accelerator::choose(AcceleratorKind kind, int local_rank, DeviceSharing sharing) {
  const bool cuda = torch::cuda::is_available();
  if (kind == AcceleratorKind::Cpu || (kind == AcceleratorKind::Auto && !cuda)) return cpu();
  if (!cuda) {
    throw std::invalid_argument(
        "accelerator 'cuda' asked for, but this LibTorch has no CUDA or no CUDA device is "
        "visible (torch::cuda::is_available() is false)");
  }
  const int index = cuda_device_index(local_rank, static_cast<int>(torch::cuda::device_count()), sharing);
  return Accelerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
}

void Accelerator::setup_device() const {
  if (!device_.is_cuda()) return;
  c10::impl::VirtualGuardImpl impl(c10::kCUDA);
  impl.setDevice(device_);
}

}  // namespace lspawn
