# LibTorch for the CPU alone, out of a CUDA build of it (a PyPI wheel's torch/ folder), without
# its CMake package: -DLSPAWN_TORCH_CPU_DIR=<site-packages>/torch.
#
# Why: a wheel's TorchConfig.cmake insists on a CUDA toolkit that matches the one torch was built
# with, and links libtorch_cuda (which loads cuBLAS, cuDNN, ...). torch 2.4's cannot be configured
# at all beside CUDA 13 ("Failed to find nvToolsExt": CUDA 12.9+ dropped it). lspawn's CPU paths
# need only libtorch_cpu and libc10, which load with no CUDA library but the runtime (2.4-2.6:
# libcudart and libcupti, found through the wheel's own RUNPATH in nvidia/*); this is how CI builds
# and tests the oldest 2.x of the supported range on a machine without a GPU. NCCL and CUDA
# tensors are off in such a build.
#
# Defines what find_package(Torch) would for lspawn's CMakeLists: the imported targets `torch` and `c10`,
# Torch_VERSION, TORCH_INSTALL_PREFIX, an empty TORCH_CUDA_LIBRARIES, and Torch_DIR (the wheel's
# own config folder, for the consumer test). The wheel's C++ ABI (_GLIBCXX_USE_CXX11_ABI: 0 for
# PyPI's 2.4-2.6, 1 from 2.7) is read from its libc10.so and applied to every target of the build,
# the launcher's too: lspawn's parts pass std::string to each other.
set(_dir "${LSPAWN_TORCH_CPU_DIR}")
if(NOT EXISTS "${_dir}/include/torch/csrc/api/include/torch/version.h" OR NOT EXISTS "${_dir}/lib/libtorch_cpu.so")
  message(FATAL_ERROR "LSPAWN_TORCH_CPU_DIR='${_dir}' is not a LibTorch folder "
                      "(expected include/torch/csrc/api/include/torch/version.h and lib/libtorch_cpu.so; "
                      "a wheel's is <site-packages>/torch)")
endif()
# The version macros: in torch/csrc/api/include/torch/version.h, which newer releases (2.11)
# reduce to an include of torch/headeronly/version.h.
set(_version_h "${_dir}/include/torch/csrc/api/include/torch/version.h")
if(EXISTS "${_dir}/include/torch/headeronly/version.h")
  set(_version_h "${_dir}/include/torch/headeronly/version.h")
endif()
file(STRINGS "${_version_h}" _lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "TORCH_VERSION_${_part} ([0-9]+)" _m "${_lines}")
  set(_v_${_part} "${CMAKE_MATCH_1}")
endforeach()
set(Torch_VERSION "${_v_MAJOR}.${_v_MINOR}.${_v_PATCH}")
if(NOT Torch_VERSION MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
  message(FATAL_ERROR "LSPAWN_TORCH_CPU_DIR='${_dir}': no TORCH_VERSION_MAJOR/MINOR/PATCH in ${_version_h}")
endif()
set(TORCH_INSTALL_PREFIX "${_dir}")
set(TORCH_CUDA_LIBRARIES "")
set(Torch_DIR "${_dir}/share/cmake/Torch")

# The ABI, from how c10's own functions that take a std::string are named: std::__cxx11::
# basic_string (new ABI) or Ss (old). (libc10 also exports libstdc++'s own new-ABI symbols,
# linked in statically, whatever its ABI: only c10:: names count.)
execute_process(COMMAND nm -D --defined-only "${_dir}/lib/libc10.so" OUTPUT_VARIABLE _syms ERROR_QUIET)
string(REGEX MATCHALL "_ZN3c10[A-Za-z0-9_]*" _c10 "${_syms}")
list(FILTER _c10 INCLUDE REGEX "NSt7__cxx1112basic_string")
list(LENGTH _c10 _n_new)
if(_n_new GREATER 0)
  set(LSPAWN_TORCH_CXX11_ABI 1)
else()
  set(LSPAWN_TORCH_CXX11_ABI 0)
endif()
add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${LSPAWN_TORCH_CXX11_ABI})

# The definitions torch_cpu's headers are read with, as the wheel's Caffe2Targets.cmake states them.
set(_defs USE_DISTRIBUTED USE_C10D_GLOO)
if(EXISTS "${_dir}/share/cmake/Caffe2/Caffe2Targets.cmake")
  file(STRINGS "${_dir}/share/cmake/Caffe2/Caffe2Targets.cmake" _targets)
  set(_in_cpu OFF)
  foreach(_l IN LISTS _targets)
    if(_l MATCHES "set_target_properties\\(torch_cpu ")
      set(_in_cpu ON)
    elseif(_in_cpu AND _l MATCHES "INTERFACE_COMPILE_DEFINITIONS \"([^\"$]*)\"")
      set(_defs ${CMAKE_MATCH_1})
      break()
    elseif(_in_cpu AND _l MATCHES "^\\)")
      set(_in_cpu OFF)
    endif()
  endforeach()
endif()

# c10 alone (the shm communicator's half types), as TorchConfig's `c10` target: without it a bare
# `c10` would link the system's libc10 (Debian's 1.13) beside this one.
add_library(c10 INTERFACE IMPORTED GLOBAL)
set_target_properties(c10 PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_dir}/include"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_dir}/include"
  INTERFACE_LINK_LIBRARIES "${_dir}/lib/libc10.so")
add_library(torch INTERFACE IMPORTED GLOBAL)
set_target_properties(torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_dir}/include;${_dir}/include/torch/csrc/api/include"
  INTERFACE_COMPILE_DEFINITIONS "${_defs}"
  INTERFACE_LINK_LIBRARIES "${_dir}/lib/libtorch_cpu.so;${_dir}/lib/libc10.so;Threads::Threads")
# The headers are the wheel's, not ours: no warnings from them.
set_property(TARGET torch PROPERTY INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_dir}/include;${_dir}/include/torch/csrc/api/include")
message(STATUS "lspawn: LibTorch ${Torch_VERSION} for the CPU only from ${_dir} "
               "(_GLIBCXX_USE_CXX11_ABI=${LSPAWN_TORCH_CXX11_ABI}; ${_defs})")
