#include "strategies/data_parallel.hpp"

#include <stdexcept>
#include <string>

namespace lspawn {

void DataParallel::setup_environment() {
  const int visible = Accelerator::device_count(AcceleratorKind::Cuda);
  num_devices_ = devices_.empty() ? std::max(1, visible) : static_cast<int>(devices_.size());
  if (num_devices_ > 1) {
    throw std::invalid_argument("DataParallel over " + std::to_string(num_devices_) +
                                " devices is not implemented in this build (one device runs as SingleDevice); "
                                "use DDP with one process per device");
  }
  SingleDevice::setup_environment();
}

}  // namespace lspawn
