#include "spawn/codec.hpp"

namespace lspawn::codec_detail {

void throw_kind_mismatch(const char* expected, const proto::Value& got) {
  throw CodecError(std::string("lspawn::Codec: expected a value of kind ") + expected + ", got " +
                   proto::kind_name(got.kind));
}

void throw_out_of_range(const char* type, const std::string& value) {
  throw CodecError("lspawn::Codec: value " + value + " does not fit in " + type);
}

void expect_list_size(const proto::Value& v, size_t expected, const char* what) {
  if (v.kind != proto::Value::Kind::kList) throw_kind_mismatch("list", v);
  if (v.list.size() != expected) {
    throw CodecError(std::string("lspawn::Codec: ") + what + " of " + std::to_string(expected) +
                     " elements expected, got a list of " + std::to_string(v.list.size()));
  }
}

}  // namespace lspawn::codec_detail
