#include "runtime/spawn/tensor_codec.hpp"

#include <torch/csrc/jit/serialization/pickle.h>

namespace lspawn {

proto::Value Codec<at::Tensor>::encode(const at::Tensor& t) {
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(t));
  return proto::Value::of_tensor(std::string(bytes.data(), bytes.size()));
}

at::Tensor Codec<at::Tensor>::decode(const proto::Value& v) {
  if (v.kind != proto::Value::Kind::kTensor) codec_detail::throw_kind_mismatch("tensor", v);
  const std::vector<char> bytes(v.s.begin(), v.s.end());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw CodecError(std::string("lspawn::Codec<at::Tensor>: cannot unpickle ") + std::to_string(bytes.size()) +
                     " bytes: " + e.what());
  }
  if (!value.isTensor()) {
    throw CodecError("lspawn::Codec<at::Tensor>: the bytes unpickle to a " + value.tagKind() + ", not a tensor");
  }
  return value.toTensor();
}

}  // namespace lspawn
