// The backend's CUDA runtime lookup (python/lspawn/distributed/_cudart.h) against a real CUDA toolkit,
// without a GPU: its declarations against the toolkit's cuda_runtime_api.h (at compile time), and its
// lookup and calls through the toolkit's libcudart.so, loaded here the way torch loads it (a dependency of
// the process, found by path). On this machine the calls fail for want of a device or a driver: that they
// return CUDA's own error, named, is what is checked; on a machine with a GPU they succeed and the IPC
// export is checked too.
#include <catch2/catch.hpp>

#include "_cudart.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>
#include <string>
#include <type_traits>

using lspawn_backend::Cudart;

// The declarations are CUDA's: same sizes, same offsets, same signatures (cudaError_t is an int-sized enum).
static_assert(sizeof(cudaError_t) == sizeof(Cudart::Error), "cudaError_t is an int");
static_assert(cudaSuccess == 0, "cudaSuccess is 0");
static_assert(sizeof(Cudart::IpcMemHandle) == sizeof(cudaIpcMemHandle_t), "cudaIpcMemHandle_t");
static_assert(Cudart::kLazyEnablePeerAccess == cudaIpcMemLazyEnablePeerAccess, "cudaIpcMemLazyEnablePeerAccess");
static_assert(offsetof(Cudart::PointerAttributes, type) == offsetof(cudaPointerAttributes, type), "type");
static_assert(offsetof(Cudart::PointerAttributes, device) == offsetof(cudaPointerAttributes, device), "device");
static_assert(sizeof(Cudart::PointerAttributes) >= sizeof(cudaPointerAttributes), "room for CUDA's struct");
namespace {
// A CUDA function's type with cudaError_t, cudaIpcMemHandle_t, cudaPointerAttributes as Cudart names them.
template <typename T>
struct As {
  using type = T;
};
template <>
struct As<cudaError_t> {
  using type = Cudart::Error;
};
template <>
struct As<cudaIpcMemHandle_t> {
  using type = Cudart::IpcMemHandle;
};
template <>
struct As<cudaIpcMemHandle_t*> {
  using type = Cudart::IpcMemHandle*;
};
template <>
struct As<cudaPointerAttributes*> {
  using type = Cudart::PointerAttributes*;
};
template <typename F>
struct Sig;
template <typename R, typename... A>
struct Sig<R (*)(A...)> {
  using type = typename As<R>::type (*)(typename As<A>::type...);
};
template <typename F>
using sig = typename Sig<F>::type;
}  // namespace
static_assert(std::is_same_v<sig<decltype(&cudaMalloc)>, decltype(Cudart::malloc)>);
static_assert(std::is_same_v<sig<decltype(&cudaFree)>, decltype(Cudart::free)>);
static_assert(std::is_same_v<sig<decltype(&cudaIpcGetMemHandle)>, decltype(Cudart::ipc_get_mem_handle)>);
static_assert(std::is_same_v<sig<decltype(&cudaIpcOpenMemHandle)>, decltype(Cudart::ipc_open_mem_handle)>);
static_assert(std::is_same_v<sig<decltype(&cudaIpcCloseMemHandle)>, decltype(Cudart::ipc_close_mem_handle)>);
static_assert(std::is_same_v<sig<decltype(&cudaPointerGetAttributes)>, decltype(Cudart::pointer_get_attributes)>);
static_assert(std::is_same_v<sig<decltype(&cudaGetLastError)>, decltype(Cudart::get_last_error)>);
static_assert(std::is_same_v<sig<decltype(&cudaGetErrorString)>, decltype(Cudart::get_error_string)>);

// One case, in order: the lookup before and after the library is loaded (a process loads it once).
TEST_CASE("backend cudart: none before libcudart is loaded, CUDA's own calls and errors after", "[cudart]") {
  const Cudart none = Cudart::load();
  CHECK_FALSE(none.ok());
  CHECK(none.why.find("no CUDA runtime (libcudart.so) is loaded") != std::string::npos);
  CHECK(none.malloc == nullptr);

  void* lib = ::dlopen(LSPAWN_TEST_CUDART, RTLD_NOW | RTLD_LOCAL);  // as libtorch_cuda.so's dependency: not global
  INFO(LSPAWN_TEST_CUDART);
  REQUIRE(lib != nullptr);
  const Cudart c = Cudart::load();
  INFO(c.why);
  REQUIRE(c.ok());
  CHECK(c.path.find("libcudart.so") != std::string::npos);

  void* p = nullptr;
  const Cudart::Error e = c.malloc(&p, 1 << 20);
  if (e != 0) {  // no device or no driver (this machine): CUDA's own error, named
    CHECK(p == nullptr);
    const std::string text = c.text("cudaMalloc", e);
    INFO(text);
    CHECK(text.rfind("cudaMalloc: ", 0) == 0);
    CHECK(text.find(c.get_error_string(e)) != std::string::npos);
    CHECK(std::string(c.get_error_string(e)).size() > 5);
    c.get_last_error();
  } else {  // a GPU: the export and the pointer's device
    Cudart::IpcMemHandle h{};
    CHECK(c.ipc_get_mem_handle(&h, p) == 0);
    Cudart::PointerAttributes a{};
    CHECK(c.pointer_get_attributes(&a, p) == 0);
    CHECK(a.device >= 0);
    CHECK(c.free(p) == 0);
  }
}
