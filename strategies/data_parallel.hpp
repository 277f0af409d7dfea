// DataParallel: one process, several devices (Lightning's DataParallelStrategy).
//
// This build implements the one-device case only: with zero or one device (CPU, or a single
// visible CUDA device) it runs as SingleDevice, which is what Lightning's DP amounts to there.
// Asking for more than one device throws std::invalid_argument at setup_environment() naming
// the count: replicate / scatter / parallel_apply / gather across devices is not implemented
// (see docs/strategies.md); use DDP with one process per device instead, as PyTorch advises.
#pragma once

#include "strategies/strategy.hpp"

#include <vector>

namespace lspawn {

class DataParallel : public SingleDevice {
 public:
  // devices: CUDA device indices to use; empty → every visible CUDA device (CPU when none).
  explicit DataParallel(std::vector<int> devices = {}, Precision precision = Precision::F32True)
      : SingleDevice(AcceleratorKind::Auto, precision), devices_(std::move(devices)) {}
  void setup_environment() override;
  // Devices the batch would be split over (after setup_environment()).
  int num_devices() const { return num_devices_; }

 private:
  std::vector<int> devices_;
  int num_devices_ = 1;
};

}  // namespace lspawn
