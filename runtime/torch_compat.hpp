// The one place where lspawn meets the differences between the two LibTorch lines it builds
// against: Debian's LibTorch 1.13 and PyPI's LibTorch 2.x. Everything else in the tree is written
// once, against the names here; no other file tests TORCH_VERSION_MAJOR.
//
// What differs, and how it is bridged:
//   - 1.13: ProcessGroupGloo / ProcessGroupNCCL *are* c10d::ProcessGroups.
//     2.x: they are c10d::Backends, and a c10d::ProcessGroup dispatches each collective to the
//     backend registered for the tensors' device type. compat::Backend names the base class of a
//     backend; wrap_backend() turns one into the ProcessGroup users hold (1.13: itself);
//     backend_of() finds the backend again (1.13: the process group itself).
//   - 2.x's c10d::Store has a pure virtual clone(): ForwardingStore<T> supplies it for stores that
//     wrap another one.
//   - 2.x's TCPStore can take a listening socket from its caller (masterListenFd): set_listen_fd();
//     where its libuv server refuses one (2.4), use_legacy_store_server() picks the legacy server.
//   - 2.1+ clients open each connection with VALIDATE + a magic number: store_protocol().
//   - c10::Error::backtrace() is a string on 1.13, a lazily symbolised one on 2.x: backtrace_of().
//   - c10d::Reducer's constructor (DDP's engine) takes other arguments: make_reducer()
//     (runtime/torch_compat_reducer.hpp, apart: its header is heavy);
//     autocast's per-device functions were renamed: autocast_enabled(), set_autocast().
//   - autograd nodes are held by std::shared_ptr or by c10::intrusive_ptr, as Edge::function's
//     type says: make_autograd_node<T>(…) (DataParallel's gradient-summing node).
//   - ProcessGroup::hasBackendForDeviceType is missing from some 2.x (2.11): backend_of() asks
//     getBackend() and catches its "no backend" error there.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "runtime/store_gate.hpp"

#define LSPAWN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace lspawn::compat {

// "1.13.0" / "2.15.0": the LibTorch lspawn was compiled against.
inline std::string torch_version() { return TORCH_VERSION; }

#if TORCH_VERSION_MAJOR >= 2
using Backend = ::c10d::Backend;
#else
using Backend = ::c10d::ProcessGroup;
#endif

// Whether ProcessGroup PG has setDefaultBackend (2.6 on: the process group is made from
// (store, rank, size) and told its default backend) or takes its default backend's name in
// ProcessGroup::Options at construction (2.4, 2.5). Decided by the headers.
template <typename PG, typename = void>
struct HasSetDefaultBackend : std::false_type {};
template <typename PG>
struct HasSetDefaultBackend<
    PG, std::void_t<decltype(std::declval<PG&>().setDefaultBackend(std::declval<const typename PG::BackendType&>()))>>
    : std::true_type {};

// The process group over `backend`, which was constructed over `store` with `rank`/`size`.
// `name` is "gloo" or "nccl": gloo serves CPU tensors (and CUDA tensors, staged through the host),
// nccl serves CUDA tensors. On 1.13 the backend is returned as it is.
template <typename PG = ::c10d::ProcessGroup>
inline c10::intrusive_ptr<PG> wrap_backend(c10::intrusive_ptr<Backend> backend,
                                           const c10::intrusive_ptr<::c10d::Store>& store, const std::string& name) {
#if TORCH_VERSION_MAJOR >= 2
  using BT = typename PG::BackendType;
  const BT type = name == "nccl" ? BT::NCCL : BT::GLOO;
  c10::intrusive_ptr<PG> pg;
  if constexpr (HasSetDefaultBackend<PG>::value) {
    pg = c10::make_intrusive<PG>(store, backend->getRank(), backend->getSize());
  } else {
    pg = c10::make_intrusive<PG>(store, backend->getRank(), backend->getSize(),
                                 c10::make_intrusive<typename PG::Options>(name));
  }
  if (type == BT::GLOO) pg->setBackend(c10::DeviceType::CPU, type, backend);
  pg->setBackend(c10::DeviceType::CUDA, type, backend);
  if constexpr (HasSetDefaultBackend<PG>::value) pg->setDefaultBackend(type);
  return pg;
#else
  (void)store;
  (void)name;
  return backend;
#endif
}

// Whether ProcessGroup PG can be asked hasBackendForDeviceType (newer 2.x; 2.11 has only
// getBackend(DeviceType), which throws when no backend is set for the device). Decided by the
// headers, not by a version number.
template <typename PG, typename = void>
struct HasBackendQuery : std::false_type {};
template <typename PG>
struct HasBackendQuery<PG, std::void_t<decltype(std::declval<PG&>().hasBackendForDeviceType(c10::DeviceType::CPU))>>
    : std::true_type {};

// The backend under `pg` that serves tensors of `device` (gloo's for the CPU); null if none.
template <typename PG = ::c10d::ProcessGroup>
inline c10::intrusive_ptr<Backend> backend_of(const c10::intrusive_ptr<PG>& pg,
                                              c10::DeviceType device = c10::DeviceType::CPU) {
#if TORCH_VERSION_MAJOR >= 2
  if (!pg) return {};
  if constexpr (HasBackendQuery<PG>::value) {
    if (!pg->hasBackendForDeviceType(device)) return {};
    return pg->getBackend(device);
  } else {
    try {
      return pg->getBackend(device);
    } catch (const c10::Error&) {
      return {};  // no backend set for `device`
    }
  }
#else
  (void)device;
  return pg;
#endif
}

// Whether lspawn may register its own descriptor with gloo's tcp Loop (GlooLoopTicker). Yes with
// Debian's libgloo (1.13), whose headers lspawn compiles against. No on 2.x: its gloo lives
// inside libtorch_cpu, newer than those headers, and its Loop behaves otherwise (Device
// destruction hung in Loop::shutdown() while the timer was registered; a crash at exit was seen
// once after unregistering it): lspawn leaves it alone there and gloo runs at its own pace.
inline constexpr bool kGlooLoopTicker = TORCH_VERSION_MAJOR < 2;

// gloo's published tcp pair address: Debian's gloo writes a sockaddr_storage then a sequence
// number (what runtime/record_auth.cpp's describe_foreign_record decodes); the gloo of 2.x
// serialises it in another layout, which lspawn does not decode (it only names it by size).
inline constexpr bool kGlooPairAddressIsSockaddrSeq = TORCH_VERSION_MAJOR < 2;

// How gloo's tcp transport listens (runtime/gloo_guard.hpp): Debian's gloo (2022) opens one
// listening socket per pair while the group connects and takes the first connection accepted as
// the pair's peer; the gloo of 2.x has one non-blocking listener per device for its lifetime and
// routes each accepted connection by the sequence number it sends first.
inline constexpr bool kGlooListenerPerPair = TORCH_VERSION_MAJOR < 2;

// The backtrace a c10::Error carries ("" when none was taken).
inline std::string backtrace_of(const c10::Error& e) {
#if TORCH_VERSION_MAJOR >= 2
  return e.backtrace() ? e.backtrace()->get() : std::string();
#else
  return e.backtrace();
#endif
}

// A store that forwards to another one (`inner_`): every operation by default, so that Derived
// overrides only what it changes. 2.x's clone() makes a copy of Derived over a clone of the inner
// store: Derived::clone_over(inner), which by default is Derived(inner); a Derived with more
// state (AuthenticatedStore) declares its own public clone_over().
template <class Derived>
class ForwardingStore : public ::c10d::Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override { return inner_->get(key); }
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  const std::chrono::milliseconds& getTimeout() const noexcept override { return inner_->getTimeout(); }
  void setTimeout(const std::chrono::milliseconds& timeout) override { inner_->setTimeout(timeout); }
  // Store::clone() (pure virtual from 2.6; absent from 1.13, 2.4 and 2.5): this overrides it
  // where the base declares it, without `override`, so that where it does not this is a plain
  // member that nothing calls and that is never instantiated (its body depends on Derived).
  c10::intrusive_ptr<::c10d::Store> clone() {
    auto& self = *static_cast<Derived*>(this);
    return self.clone_over(self.inner_->clone());
  }
  // Only instantiated where used (2.x's clone() of a Derived without its own clone_over).
  c10::intrusive_ptr<::c10d::Store> clone_over(c10::intrusive_ptr<::c10d::Store> inner) const {
    return c10::make_intrusive<Derived>(std::move(inner));
  }

 protected:
  explicit ForwardingStore(c10::intrusive_ptr<::c10d::Store> inner) : inner_(std::move(inner)) {}
  c10::intrusive_ptr<::c10d::Store> inner_;
};

// Hands a bound, listening socket to a TCPStore server (TCPStoreOptions::masterListenFd, 2.x),
// so that it listens where lspawn chose (runtime/store_listener.hpp). Returns false where the
// option does not exist (1.13: the server binds its own socket; store_listener then steers that
// bind instead).
inline bool set_listen_fd(::c10d::TCPStoreOptions& options, int fd) {
#if TORCH_VERSION_MAJOR >= 2
  options.masterListenFd = fd;
  return true;
#else
  (void)options;
  (void)fd;
  return false;
#endif
}

// Whether TCPStoreOptions O can choose TCPStore's server (useLibUV: 2.x).
template <typename O, typename = void>
struct HasLibUVChoice : std::false_type {};
template <typename O>
struct HasLibUVChoice<O, std::void_t<decltype(std::declval<O&>().useLibUV)>> : std::true_type {};

// The libuv TCPStore server of some 2.x (2.4: "The libuv TCPStore backend does not support
// initialization with an listen fd") refuses a listening socket handed over with
// set_listen_fd(); their legacy server takes it. No header says which releases, so the refusal
// itself is the witness: when `e` is that refusal, switches `options` to the legacy server and
// returns true (the caller constructs the store again); false for any other error.
template <typename O = ::c10d::TCPStoreOptions>
inline bool use_legacy_store_server(O& options, const std::exception& e) {
  if constexpr (HasLibUVChoice<O>::value) {
    const std::string what = e.what();
    if (!options.useLibUV || what.find("does not support initialization with an listen fd") == std::string::npos)
      return false;
    options.useLibUV = false;
    return true;
  } else {
    (void)options;
    (void)e;
    return false;
  }
}

// How a TCPStore client opens a connection (runtime/store_gate.hpp checks it): from 2.1 on, with
// a VALIDATE request and a magic number (pytorch/pytorch#107607); before, with its first request.
inline StoreProtocol store_protocol() {
#if LSPAWN_TORCH_AT_LEAST(2, 1)
  return StoreProtocol::Validated;
#else
  return StoreProtocol::Legacy;
#endif
}

}  // namespace lspawn::compat

// ---- strategies/: autocast, and DDP's engine (c10d::Reducer) --------------------------------
#include <ATen/autocast_mode.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace lspawn::compat {

// Autocast state of one device type (CPU or CUDA): enabled flag and lower-precision dtype.
inline bool autocast_enabled(at::DeviceType type) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
inline at::ScalarType autocast_dtype(at::DeviceType type) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_autocast(at::DeviceType type, bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

// A new autograd node of type T (a torch::autograd::Node), held as the graph holds its nodes:
// the type of Edge::function decides (std::shared_ptr<Node> on 1.13 and on 2.x up to at least
// 2.11, c10::intrusive_ptr<Node> on 2.15); either converts to what torch::autograd::set_history
// and Edge take.
//
// The Edge type is reached through T (a Node's next_edge()), so it is looked at only where the
// node is made, in a TU that has torch/csrc/autograd/function.h: this header does not include
// autograd/edge.h, which on 2.15 cannot stand alone (Edge destroys an intrusive_ptr<Node> of an
// incomplete Node) and broke every TU that included it without function.h.
template <typename T, typename... Args>
auto make_autograd_node(Args&&... args) {
  using NodeHandle = std::decay_t<decltype(std::declval<const T&>().next_edge(0).function)>;
  if constexpr (std::is_same_v<NodeHandle, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

}  // namespace lspawn::compat
