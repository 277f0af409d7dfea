// The one place where lspawn meets the differences between the two LibTorch lines it builds
// against: Debian's LibTorch 1.13 and PyPI's LibTorch 2.x. Everything else in the tree is written
// once, against the functions here; no other file tests TORCH_VERSION_MAJOR.
//
// What differs (and is handled here):
//   - 1.13: ProcessGroupGloo / ProcessGroupNCCL *are* c10d::ProcessGroups.
//     2.x: they are c10d::Backends, and a c10d::ProcessGroup wraps one backend per device type.
//   - c10d::Reducer's constructor takes other arguments (DDP's engine, strategies/).
#pragma once

#include <torch/version.h>

#define LSPAWN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
