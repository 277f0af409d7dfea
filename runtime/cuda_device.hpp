// Which CUDA device a worker uses, and why not when it cannot.
//
// A worker's device is cuda:LOCAL_RANK among the devices visible to the process: CUDA numbers the
// devices of CUDA_VISIBLE_DEVICES from 0 in the order given, so LOCAL_RANK indexes that list as it
// is (torchrun's and Lightning's convention). Checked before an NCCL process group is made, so a
// worker without a device fails with the variables that explain it instead of inside NCCL.
#pragma once

#include <string>

namespace lspawn {

// The index of the CUDA device for `local_rank` when `device_count` devices are visible
// (`cuda_visible_devices`: the variable's value, or null when unset). Throws ProcessGroupError
// naming LOCAL_RANK, the device count and CUDA_VISIBLE_DEVICES when there is no such device.
int cuda_device_for(int local_rank, int device_count, const char* cuda_visible_devices);

// CUDA devices visible to this process (0 with a CPU-only LibTorch or no driver).
int cuda_device_count();

// Makes `device` the calling thread's current CUDA device (collectives and NCCL use it).
void set_cuda_device(int device);

}  // namespace lspawn
