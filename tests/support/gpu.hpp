// Whether this machine has an NVIDIA GPU, for tests whose expectations differ with one (CUDA
// tensors, a start method CUDA's threads refuse, `--nproc-per-node gpu`). Read from the driver's
// device nodes, /dev/nvidia0 or /dev/nvidiactl, as lspawn itself counts GPUs: nothing loads CUDA,
// so a test that forks afterwards still may. Tests only.
#pragma once

#include <unistd.h>

namespace lspawn::test {

inline bool machine_has_nvidia_gpu() {
  return ::access("/dev/nvidia0", F_OK) == 0 || ::access("/dev/nvidiactl", F_OK) == 0;
}

}  // namespace lspawn::test
