// GlooConnectStore: the store ProcessGroupGloo connects through (init_process_group puts it over
// the backend's PrefixStore). gloo's connectFullMesh parses each peer's pair-address record without
// looking: an empty value crashed it (SIGSEGV in gloo::transport::tcp::Rank::Rank). TCPStore
// returns one when a wait is woken without the key — LibTorch 2.x's libuv store server does that
// whenever a compareSet() finds the key missing, whoever sent it. Here:
//   - get(k) returns only once k is set (get_when_set, runtime/rendezvous.hpp), until the store's
//     timeout;
//   - multiGet(keys) (2.x; gloo's batched read, GLOO_ENABLE_STORE_V2_API=1) returns only once
//     every key is set: wait(keys) and check(keys) until all are there, then one inner multiGet;
//     a value still empty is read again with get_when_set;
//   - hasExtendedApi / multiSet / append are the inner store's (runtime/store_extended_api.hpp),
//     so that gloo batches its reads when the stores below can.
// Everything else is forwarded. Thread-safe as far as the inner store is.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/rendezvous.hpp"
#include "runtime/store_extended_api.hpp"
#include "runtime/torch_compat.hpp"

namespace lspawn {

class GlooConnectStore final : public compat::ForwardingStore<GlooConnectStore> {
 public:
  explicit GlooConnectStore(c10::intrusive_ptr<c10d::Store> store) : ForwardingStore(std::move(store)) {}

  std::vector<uint8_t> get(const std::string& key) override { return get_when_set(*inner_, key); }

  // Members of c10d::Store's extended API (2.x), without `override`: see store_extended_api.hpp.
  bool hasExtendedApi() const { return compat::has_extended_api(*inner_); }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) {
    wait_until_all_set(keys);
    auto values = compat::multi_get(*inner_, keys);
    if (values.size() != keys.size()) {
      throw std::runtime_error("multiGet: the store answered " + std::to_string(values.size()) + " values for " +
                               std::to_string(keys.size()) + " keys");
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (values[i].empty()) values[i] = get_when_set(*inner_, keys[i]);
    }
    return values;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
    compat::multi_set(*inner_, keys, values);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) { compat::append(*inner_, key, value); }

 private:
  // wait(keys) can return without the keys (a compareSet's wake-up, above): check() says whether
  // all are there; wait again until the store's timeout.
  void wait_until_all_set(const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    const auto deadline = std::chrono::steady_clock::now() + inner_->getTimeout();
    const auto named =
        "store keys '" + keys.front() + "' .. '" + keys.back() + "' (" + std::to_string(keys.size()) + ")";
    for (;;) {
      try {
        inner_->wait(keys);
      } catch (const c10::Error& e) {  // TCPStore's timeout names no key
        throw std::runtime_error("waiting for " + named + ": " + e.what_without_backtrace());
      }
      if (inner_->check(keys)) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error(named + " not all set within " + std::to_string(inner_->getTimeout().count()) + " ms");
      }
    }
  }
};

}  // namespace lspawn
