// lspawn::Codec<at::Tensor>: tensors as spawn() arguments and results.
// Link lspawn::spawn_torch. Reference: runtime/spawn/tensor_codec.hpp.
#pragma once

#include "runtime/spawn/tensor_codec.hpp"
