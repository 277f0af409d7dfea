#include "launcher/spawn/codec.hpp"

namespace lspawn::codec_detail {

const char* kind_name(const proto::Value& v) {
  switch (v.kind_case()) {
    case proto::Value::kI: return "int64";
    case proto::Value::kF: return "double";
    case proto::Value::kB: return "bool";
    case proto::Value::kS: return "string";
    case proto::Value::kTensor: return "tensor";
    case proto::Value::kList: return "list";
    case proto::Value::kBlob: return "blob";
    case proto::Value::KIND_NOT_SET: return "nothing";
  }
  return "an unknown kind";
}

void throw_kind_mismatch(const char* expected, const proto::Value& got) {
  throw CodecError(std::string("lspawn::Codec: expected a value of kind ") + expected + ", got " +
                   kind_name(got));
}

void throw_out_of_range(const char* type, const std::string& value) {
  throw CodecError("lspawn::Codec: value " + value + " does not fit in " + type);
}

void expect_list_size(const proto::Value& v, size_t expected, const char* what) {
  if (v.kind_case() != proto::Value::kList) throw_kind_mismatch("list", v);
  if (static_cast<size_t>(v.list().items_size()) != expected) {
    throw CodecError(std::string("lspawn::Codec: ") + what + " of " + std::to_string(expected) +
                     " elements expected, got a list of " +
                     std::to_string(v.list().items_size()));
  }
}

}  // namespace lspawn::codec_detail
