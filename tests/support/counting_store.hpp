// CountingStore: a c10d::Store over another (a rank's TCPStore client) that counts the calls
// reaching it, by kind, to show how many requests a rendezvous or a connect costs
// (tests/runtime/authenticated_store_test.cpp, bench/scale/gloo_mesh_bench.cpp). Needs LibTorch:
// included only by LibTorch-linked tests and benches (header-only; lspawn_test_support stays
// torch-free). Tests and benches only.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/store_extended_api.hpp"
#include "runtime/torch_compat.hpp"

namespace lspawn::test {

// The calls that reached the store under a CountingStore; `multi_get_keys`: the keys of all
// its multiGets. Shared, so that it outlives a store that gloo or a rendezvous holds.
struct StoreCounts {
  std::atomic<long> get{0}, multi_get{0}, multi_get_keys{0}, wait{0}, check{0}, set{0};
};

class CountingStore final : public compat::ForwardingStore<CountingStore> {
 public:
  explicit CountingStore(c10::intrusive_ptr<c10d::Store> inner,
                         std::shared_ptr<StoreCounts> counts = std::make_shared<StoreCounts>())
      : ForwardingStore(std::move(inner)), counts_(std::move(counts)) {}

  const StoreCounts& counts() const { return *counts_; }

  std::vector<uint8_t> get(const std::string& key) override {
    ++counts_->get;
    return inner_->get(key);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    ++counts_->set;
    inner_->set(key, value);
  }
  bool check(const std::vector<std::string>& keys) override {
    ++counts_->check;
    return inner_->check(keys);
  }
  void wait(const std::vector<std::string>& keys) override {
    ++counts_->wait;
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    ++counts_->wait;
    inner_->wait(keys, timeout);
  }
  // The extended API (runtime/store_extended_api.hpp) where the store under it has it.
  bool hasExtendedApi() const { return compat::has_extended_api(*inner_); }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) {
    ++counts_->multi_get;
    counts_->multi_get_keys += static_cast<long>(keys.size());
    return compat::multi_get(*inner_, keys);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
    compat::multi_set(*inner_, keys, values);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) { compat::append(*inner_, key, value); }

 private:
  std::shared_ptr<StoreCounts> counts_;
};

}  // namespace lspawn::test
