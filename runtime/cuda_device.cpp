#include "runtime/cuda_device.hpp"

#include <torch/cuda.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "runtime/process_group.hpp"

namespace lspawn {

int cuda_device_for(int local_rank, int device_count, const char* cuda_visible_devices) {
  if (local_rank >= 0 && local_rank < device_count) return local_rank;
  const std::string visible = cuda_visible_devices == nullptr ? "unset" : "'" + std::string(cuda_visible_devices) + "'";
  if (device_count <= 0) {
    throw ProcessGroupError("LOCAL_RANK=" + std::to_string(local_rank) +
                            " needs a CUDA device, but none is visible (CUDA_VISIBLE_DEVICES " + visible +
                            "; a CPU-only LibTorch or no NVIDIA driver also shows none): use backend gloo");
  }
  throw ProcessGroupError("LOCAL_RANK=" + std::to_string(local_rank) +
                          " has no CUDA device: " + std::to_string(device_count) + " visible (CUDA_VISIBLE_DEVICES " +
                          visible + "); start at most " + std::to_string(device_count) +
                          " workers per node for backend nccl (NCCL refuses two ranks on one GPU)");
}

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

void set_cuda_device(int device) {
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace lspawn
