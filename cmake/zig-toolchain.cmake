# A cross toolchain from zig (PyPI's `ziglang`): `zig cc` / `zig c++` build for any
# <arch>-linux-gnu.<glibc> from this machine, against the stub libc of that glibc release (so no
# symbol newer than it can be linked) and libc++/libunwind linked statically. What
# scripts/build-wheel-cross.sh builds the wheels for older Linux and for aarch64 with
# (docs/python.md, "Which wheel"); only the torch-free launcher builds this way
# (LSPAWN_LAUNCHER_ONLY: LibTorch is not a zig target).
#   cmake -DCMAKE_TOOLCHAIN_FILE=cmake/zig-toolchain.cmake -DLSPAWN_ZIG_TARGET=aarch64-linux-gnu.2.17 ...
# LSPAWN_ZIG_TARGET: zig's target, <arch>-linux-gnu.<glibc version> (x86_64 or aarch64).
# The compilers are cmake/zig/'s wrappers; they run $LSPAWN_ZIG, or .deps/zig/bin/zig.
if(NOT LSPAWN_ZIG_TARGET)
  set(LSPAWN_ZIG_TARGET "$ENV{LSPAWN_ZIG_TARGET}")
endif()
if(NOT LSPAWN_ZIG_TARGET MATCHES "^(x86_64|aarch64)-linux-gnu\\.2\\.[0-9]+$")
  message(FATAL_ERROR "cmake/zig-toolchain.cmake: LSPAWN_ZIG_TARGET is '${LSPAWN_ZIG_TARGET}'; expected "
                      "<x86_64|aarch64>-linux-gnu.<glibc>, e.g. x86_64-linux-gnu.2.17")
endif()
# try_compile projects read this file again: hand them the target.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES LSPAWN_ZIG_TARGET)
string(REGEX MATCH "^[a-z0-9_]+" _zig_arch "${LSPAWN_ZIG_TARGET}")

# The zig the wrappers run (the same default as theirs): its version, for ccache (CMakeLists.txt),
# and a plain error here rather than one from every compile.
if(DEFINED ENV{LSPAWN_ZIG})
  set(_zig "$ENV{LSPAWN_ZIG}")
else()
  set(_zig "${CMAKE_CURRENT_LIST_DIR}/../.deps/zig/bin/zig")
endif()
execute_process(COMMAND ${_zig} version OUTPUT_VARIABLE LSPAWN_ZIG_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE _zig_rc ERROR_QUIET)
if(NOT _zig_rc EQUAL 0)
  message(FATAL_ERROR "cmake/zig-toolchain.cmake: cannot run zig at '${_zig}' (${_zig_rc}); set LSPAWN_ZIG to "
                      "a zig binary, or run scripts/build-wheel-cross.sh, which installs one into .deps/zig")
endif()

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ${_zig_arch})
set(CMAKE_C_COMPILER ${CMAKE_CURRENT_LIST_DIR}/zig/cc)
set(CMAKE_CXX_COMPILER ${CMAKE_CURRENT_LIST_DIR}/zig/c++)
# CMake passes --target=<this> to every compile and link (zig accepts clang's spelling), so the
# target is on each command line: ccache's key holds it, and one zig serves every target.
set(CMAKE_C_COMPILER_TARGET ${LSPAWN_ZIG_TARGET})
set(CMAKE_CXX_COMPILER_TARGET ${LSPAWN_ZIG_TARGET})
set(CMAKE_AR ${CMAKE_CURRENT_LIST_DIR}/zig/ar CACHE FILEPATH "zig ar")
set(CMAKE_RANLIB ${CMAKE_CURRENT_LIST_DIR}/zig/ranlib CACHE FILEPATH "zig ranlib")
# The installed files are stripped (pyproject.toml: install.strip); this machine's binutils strip
# knows no aarch64 ELF ("Unable to recognise the format") and zig has no strip: LLVM's knows every
# target (Debian: llvm).
find_program(LSPAWN_LLVM_STRIP NAMES llvm-strip llvm-strip-19 llvm-strip-16 llvm-strip-15 llvm-strip-14)
if(NOT LSPAWN_LLVM_STRIP)
  message(FATAL_ERROR "cmake/zig-toolchain.cmake: no llvm-strip on PATH (Debian: apt-get install llvm); "
                      "binutils' strip cannot strip a ${_zig_arch} binary")
endif()
set(CMAKE_STRIP ${LSPAWN_LLVM_STRIP} CACHE FILEPATH "strip for ${_zig_arch}")
# Headers (nlohmann-json) and CMake packages come from this machine; libraries and programs must
# not (they are x86_64 and of this machine's glibc): zig brings the target's libc and C++ library.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
