// Store records anyone who reaches the store can write: RecordAuth::open accepts only what
// seal() made with the same secret and key, and describe_foreign_record (which names a
// refused record in messages) reads any bytes safely. The first bytes anyone can send to a gloo
// listener: check_connection_token accepts only what connection_token() made with the secret.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/record_auth.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lspawn::RecordAuth auth("fuzz-secret-0123456789abcdef");
  const std::vector<uint8_t> value(data, data + size);
  const std::string key = "lspawn/run/0/rdzv/rank/" + std::to_string(size % 8);
  if (auth.open(key, value)) {
    // Forging a MAC by chance is not expected; only a sealed seed can open.
    if (!auth.open(key, auth.seal(key, *auth.open(key, value)))) std::abort();
  }
  const auto sealed = auth.seal(key, value);
  const auto opened = auth.open(key, sealed);
  if (!opened || *opened != value) std::abort();
  (void)lspawn::describe_foreign_record(value);
  lspawn::RecordAuth::Token token{};
  std::memcpy(token.data(), data, std::min(size, token.size()));
  if (auth.check_connection_token(token)) std::abort();  // forging a MAC by chance is not expected
  if (!auth.check_connection_token(auth.connection_token())) std::abort();
  return 0;
}
