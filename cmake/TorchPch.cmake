# The precompiled LibTorch headers, built twice per build directory and shared by every target
# that compiles them (target_precompile_headers REUSE_FROM).
#
# Why shared: a GCC PCH of these headers is a 370-760 MB file (with or without -g: 553 MB at -g0,
# 689 MB at -g for runtime's list on 2.15), and one per target made six per build directory,
# 9.5 GB of the 17 GB that scripts/test.sh's three LibTorch lines wrote; a CI machine with less
# free disk failed writing one (docs/reliability.md, "Disk"). Two remain per build directory:
#  - lspawn_torch_pch     for the libraries (compiled -fPIC);
#  - lspawn_torch_pch_exe for the test executables (-fPIE, Catch2 last).
# GCC refuses a PCH made with another -fpic/-fpie setting, hence two. Each list is the union of
# what its users included before; the macros they define (LSPAWN_HAVE_NCCL, LSPAWN_BIN, ...) are
# not read by these headers, so GCC accepts the PCH for all of them (-Winvalid-pch says otherwise).
#
# Usage: lspawn_use_torch_pch(<target>) picks by the target's type.

# Debian's 1.13 reducer.hpp includes torch/csrc/distributed/autograd/context/context.h, which its
# libtorch-dev does not ship: strategies/shim stands in for it (only when it is really missing).
set(LSPAWN_REDUCER_SHIM ${CMAKE_CURRENT_LIST_DIR}/../strategies/shim)
foreach(_dir ${TORCH_INCLUDE_DIRS})
  if(EXISTS ${_dir}/torch/csrc/distributed/autograd/context/context.h)
    set(LSPAWN_REDUCER_SHIM "")
  endif()
endforeach()

set(_lspawn_torch_pch_headers
  <ATen/ATen.h>
  <torch/nn/module.h>
  <torch/optim/optimizer.h>
  <torch/csrc/distributed/c10d/ProcessGroup.hpp>
  <torch/csrc/distributed/c10d/Store.hpp>
  <torch/csrc/distributed/c10d/TCPStore.hpp>
  <torch/csrc/distributed/c10d/PrefixStore.hpp>
  <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
  <torch/csrc/distributed/c10d/reducer.hpp>)

add_library(lspawn_torch_pch OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
target_link_libraries(lspawn_torch_pch PRIVATE torch lspawn_gloo_headers)
if(LSPAWN_REDUCER_SHIM)
  target_include_directories(lspawn_torch_pch SYSTEM PRIVATE ${LSPAWN_REDUCER_SHIM})
endif()
target_precompile_headers(lspawn_torch_pch PRIVATE ${_lspawn_torch_pch_headers})

# Compiled as CMake compiles an executable's sources (-fPIE, not the -fPIC of a library).
# Order matters: c10's glog headers define CHECK as well; Catch's definition must come last.
add_library(lspawn_torch_pch_exe OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
set_target_properties(lspawn_torch_pch_exe PROPERTIES POSITION_INDEPENDENT_CODE OFF)
target_compile_options(lspawn_torch_pch_exe PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
target_link_libraries(lspawn_torch_pch_exe PRIVATE torch)
target_precompile_headers(lspawn_torch_pch_exe PRIVATE
  <ATen/ATen.h>
  <torch/nn/module.h>
  <torch/csrc/distributed/c10d/ProcessGroup.hpp>
  <torch/csrc/distributed/c10d/TCPStore.hpp>
  <catch2/catch.hpp>)

function(lspawn_use_torch_pch target)
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "EXECUTABLE")
    target_precompile_headers(${target} REUSE_FROM lspawn_torch_pch_exe)
  else()
    target_precompile_headers(${target} REUSE_FROM lspawn_torch_pch)
  endif()
endfunction()
