// Cudart: the eight CUDA runtime calls the backend's CUDA IPC path makes (_cuda_ipc.h), looked up at run
// time in the libcudart.so that this process already has loaded (a CUDA torch loads it with
// libtorch_cuda.so), by that library's path, so that it is found whether torch put it in the global scope
// or not.
//
// No CUDA header and no CUDA library at build time: the shim is built with the torch's headers alone (a
// CPU torch has no CUDA, a CUDA torch's wheel no CUDA headers) and names no library, so one build of the
// shim serves a CPU and a CUDA torch of one release. The declarations below are CUDA's own, unchanged since
// CUDA 4 (IPC) and CUDA 10 (cudaPointerAttributes' leading {type, device}); they are checked against the
// toolkit's cuda_runtime_api.h and the calls made through a real libcudart where a toolkit is installed
// (tests/python_backend/cudart_test.cpp). Torch-free: that test includes it without LibTorch.
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

namespace lspawn_backend {

// The CUDA runtime calls CudaIpc makes, from the libcudart.so loaded in this process (none: ok() false).
struct Cudart {
  // CUDA's types, as cuda_runtime_api.h / driver_types.h declare them.
  using Error = int;  // cudaError_t; cudaSuccess is 0
  struct IpcMemHandle {
    char reserved[64];  // CUDA_IPC_HANDLE_SIZE
  };
  struct PointerAttributes {  // cudaPointerAttributes: {cudaMemoryType type; int device; ...}, larger since
    int type;                 // CUDA 11; room to spare for what a later CUDA appends
    int device;
    void* device_pointer;
    void* host_pointer;
    long reserved[64];
  };
  static constexpr unsigned kLazyEnablePeerAccess = 1;  // cudaIpcMemLazyEnablePeerAccess

  Error (*malloc)(void**, std::size_t) = nullptr;
  Error (*free)(void*) = nullptr;
  Error (*ipc_get_mem_handle)(IpcMemHandle*, void*) = nullptr;
  Error (*ipc_open_mem_handle)(void**, IpcMemHandle, unsigned) = nullptr;
  Error (*ipc_close_mem_handle)(void*) = nullptr;
  Error (*pointer_get_attributes)(PointerAttributes*, const void*) = nullptr;
  Error (*get_last_error)() = nullptr;
  const char* (*get_error_string)(Error) = nullptr;
  std::string path;  // the library the calls come from
  std::string why;   // why there are none ("" when there are)

  bool ok() const { return why.empty(); }
  std::string text(const char* call, Error e) const {
    return std::string(call) + ": " + (get_error_string ? get_error_string(e) : "error") + " (" + std::to_string(e) +
           ")";
  }

  // The runtime of this process: looked up once, at the first CUDA tensor.
  static const Cudart& get() {
    static const Cudart c = load();
    return c;
  }

  // Looks it up now (get() keeps the first answer).
  static Cudart load() {
    Cudart c;
    // The loaded object whose name has libcudart.so in it (libtorch_cuda.so's dependency): by its path, so
    // that it is found whether torch loaded it into the global scope or not.
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* out) -> int {
          const char* name = info->dlpi_name;
          if (name && std::strstr(name, "libcudart.so")) {
            *static_cast<std::string*>(out) = name;
            return 1;
          }
          return 0;
        },
        &c.path);
    if (c.path.empty()) {
      c.why = "no CUDA runtime (libcudart.so) is loaded in this process (a torch whose CUDA runtime is linked in "
              "statically?)";
      return c;
    }
    void* lib = ::dlopen(c.path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
      c.why = c.path + ": dlopen: " + ::dlerror();
      return c;
    }
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (!fn && c.why.empty()) c.why = c.path + " has no " + name;
    };
    find(c.malloc, "cudaMalloc");
    find(c.free, "cudaFree");
    find(c.ipc_get_mem_handle, "cudaIpcGetMemHandle");
    find(c.ipc_open_mem_handle, "cudaIpcOpenMemHandle");
    find(c.ipc_close_mem_handle, "cudaIpcCloseMemHandle");
    find(c.pointer_get_attributes, "cudaPointerGetAttributes");
    find(c.get_last_error, "cudaGetLastError");
    find(c.get_error_string, "cudaGetErrorString");
    return c;  // the handle stays open: torch keeps the library loaded anyway
  }
};

}  // namespace lspawn_backend
