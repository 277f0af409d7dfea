// lspawn::Codec<at::Tensor>: tensors as spawn() arguments and results.
//
// A tensor travels as torch::pickle_save bytes (proto Value.tensor): dtype, shape, strides,
// device and requires_grad survive; the storage is copied (a tensor that many workers must
// share without copies belongs in a ModelWrapper, runtime/spawn/model_wrapper.hpp). Under
// StartMethod::Fork arguments are not encoded at all: the child sees the parent's tensor,
// copy-on-write.
//
// Include this header (or <lspawn/tensor_codec.hpp>) in the translation unit that calls spawn()
// or LSPAWN_REGISTER with a tensor parameter; link lspawn::spawn_torch.
#pragma once

#include <ATen/core/Tensor.h>

#include "spawn/codec.hpp"

namespace lspawn {

template <>
struct Codec<at::Tensor> {
  using is_lspawn_codec = void;
  static proto::Value encode(const at::Tensor& t);
  // Throws CodecError when the value is not a tensor or its bytes do not unpickle to one.
  static at::Tensor decode(const proto::Value& v);
};

}  // namespace lspawn
