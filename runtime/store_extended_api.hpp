// c10d::Store's extended API — append, multiGet, multiSet, and hasExtendedApi() saying that all
// three are implemented efficiently — where the LibTorch has it (2.x), and nothing where it does
// not (1.13). Apart from runtime/torch_compat.hpp on purpose: only the store wrappers that keep
// the extended API (AuthenticatedStore, GlooConnectStore) include this, not every LibTorch TU.
//
// Why it matters: gloo's full-mesh connect (gloo/transport/tcp/context.cc,
// createAndConnectAllPairs) reads the W peers' address records with one multi_get per 128 ranks
// when GLOO_ENABLE_STORE_V2_API=1 (or True) is set *and* the store says hasExtendedApi();
// otherwise with W wait + get pairs (docs/scale-gloo-mesh.md). c10d::Store's defaults answer
// hasExtendedApi() == false, so a wrapper that does not forward it hides the batched path.
//
// compat::ForwardingStore deliberately does not forward these: a wrapper that changes get()
// (GlooConnectStore waits until the key is set; AuthenticatedStore verifies each record) must say
// what multiGet() means for it, or a batched read would bypass its get(). Each wrapper that keeps
// the extended API declares the four members itself, without `override` (as ForwardingStore's
// clone()): they override where c10d::Store declares them and are plain members nothing calls
// where it does not. Their bodies use the helpers below, which compile on both lines.
//
// Detected from the headers (c10d::Store::hasExtendedApi), not from a version number.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lspawn::compat {

// Whether store type S declares the extended API (c10d::Store: 2.x yes, 1.13 no).
template <typename S, typename = void>
struct HasExtendedApi : std::false_type {};
template <typename S>
struct HasExtendedApi<
    S, std::void_t<decltype(std::declval<const S&>().hasExtendedApi()),
                   decltype(std::declval<S&>().multiGet(std::declval<const std::vector<std::string>&>()))>>
    : std::true_type {};

inline constexpr bool kStoreHasExtendedApi = HasExtendedApi<::c10d::Store>::value;

// store.hasExtendedApi(); false where the API does not exist.
template <typename S = ::c10d::Store>
bool has_extended_api(const S& store) {
  if constexpr (HasExtendedApi<S>::value) {
    return store.hasExtendedApi();
  } else {
    (void)store;
    return false;
  }
}

// store.multiGet(keys) (which waits for every key, as get() does); one get() per key where the
// API does not exist.
template <typename S = ::c10d::Store>
std::vector<std::vector<uint8_t>> multi_get(S& store, const std::vector<std::string>& keys) {
  if constexpr (HasExtendedApi<S>::value) {
    return store.multiGet(keys);
  } else {
    std::vector<std::vector<uint8_t>> values;
    values.reserve(keys.size());
    for (const auto& k : keys) values.push_back(store.get(k));
    return values;
  }
}

// store.multiSet(keys, values); one set() per key where the API does not exist.
template <typename S = ::c10d::Store>
void multi_set(S& store, const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
  if (keys.size() != values.size()) {
    throw std::invalid_argument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                                std::to_string(values.size()) + " values");
  }
  if constexpr (HasExtendedApi<S>::value) {
    store.multiSet(keys, values);
  } else {
    for (size_t i = 0; i < keys.size(); ++i) store.set(keys[i], values[i]);
  }
}

// store.append(key, value). Where the API does not exist nothing calls it (it is no virtual
// member there): a call is a logic error.
template <typename S = ::c10d::Store>
void append(S& store, const std::string& key, const std::vector<uint8_t>& value) {
  if constexpr (HasExtendedApi<S>::value) {
    store.append(key, value);
  } else {
    (void)store;
    (void)value;
    throw std::logic_error("append('" + key + "'): this LibTorch's c10d::Store has no append");
  }
}

}  // namespace lspawn::compat
