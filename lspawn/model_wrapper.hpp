// lspawn::ModelWrapper<M>: one model for every spawn() worker, without a copy per worker
// (MpModelWrapper). Link lspawn::spawn_torch. Reference: runtime/spawn/model_wrapper.hpp.
#pragma once

#include "runtime/spawn/model_wrapper.hpp"
#include "runtime/spawn/tensor_codec.hpp"
