# Installs the lspawn build at BUILD_DIR into a fresh temporary prefix, configures and builds
# the consumer project (SOURCE_DIR) against it with find_package(lspawn), and runs it: the
# torch-free consumer_app and, when the install has the torch parts, consumer_worker. Before that,
# the public face (docs/using-lspawn-from-cmake.md): the installed include tree is lspawn/*.hpp and
# lspawn/detail/ alone, with none of the headers only lspawn's implementation needs (PARTS_FILE:
# cmake/parts.cmake, LSPAWN_IMPLEMENTATION_HEADERS), every exported target's include directory is
# <prefix>/include, and the consumer's configure proves no part's header can be included.
# Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DGENERATOR= -DPARTS_FILE= [-DCXX_FLAGS=] [-DLINK_FLAGS=]
# [-DTORCH_DIR=]: the Torch_DIR the build found, handed on so the consumer finds the same Torch
# however the build found it (a multi-entry CMAKE_PREFIX_PATH, a Torch_DIR on the command line).
# [-DCCACHE= -DCCACHE_BASEDIR=]: compile through ccache, with the build's settings.
foreach(v BUILD_DIR SOURCE_DIR GENERATOR PARTS_FILE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_consumer.cmake: ${v} is not set")
  endif()
endforeach()

# Inside the build directory: with ccache's base_dir the source tree, the prefix, the consumer's
# sources and a 2.x LibTorch under .deps/ are all seen by relative paths (../prefix/include, ...),
# the same whatever mktemp names it.
execute_process(COMMAND mktemp -d ${BUILD_DIR}/lspawn-consumer-XXXXXX
  OUTPUT_VARIABLE work OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mktemp failed: ${rc}")
endif()

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    file(REMOVE_RECURSE ${work})
    message(FATAL_ERROR "consumer test: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "consumer test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${work}/prefix)

# Fails the test with `what`, after removing the work directory.
function(fail what)
  file(REMOVE_RECURSE ${work})
  message(FATAL_ERROR "consumer test: ${what}")
endfunction()
set(inc ${work}/prefix/include)
if(NOT EXISTS ${inc}/lspawn/spawn.hpp)
  fail("the install has no include/lspawn/spawn.hpp")
endif()
# What a program's include path (<prefix>/include) shows: lspawn/ and nothing else; in it, the
# public headers and detail/.
file(GLOB top RELATIVE ${inc} ${inc}/*)
if(NOT top STREQUAL "lspawn")
  fail("include/ holds more than lspawn/: ${top}")
endif()
file(GLOB face RELATIVE ${inc}/lspawn ${inc}/lspawn/*)
foreach(f ${face})
  if(NOT f STREQUAL "detail" AND (NOT f MATCHES "\\.hpp$" OR IS_DIRECTORY ${inc}/lspawn/${f}))
    fail("include/lspawn/ holds ${f}: a part's folder beside the public headers")
  endif()
endforeach()
include(${PARTS_FILE})  # LSPAWN_IMPLEMENTATION_HEADERS
foreach(h ${LSPAWN_IMPLEMENTATION_HEADERS})
  foreach(at ${inc}/${h} ${inc}/lspawn/${h} ${inc}/lspawn/detail/${h})
    if(EXISTS ${at})
      fail("the install has ${at}, a header only lspawn's implementation needs")
    endif()
  endforeach()
endforeach()
file(GLOB targets_files ${work}/prefix/lib*/cmake/lspawn/lspawnTargets.cmake)
if(NOT targets_files)
  fail("the install has no lib/cmake/lspawn/lspawnTargets.cmake")
endif()
file(STRINGS ${targets_files} dirs REGEX "INTERFACE_INCLUDE_DIRECTORIES")
foreach(d ${dirs})
  if(d MATCHES "_IMPORT_PREFIX}/include/")
    fail("an exported target's include directory is below <prefix>/include: ${d}")
  endif()
endforeach()
list(LENGTH face n_face)
message(STATUS "consumer test: the installed include tree: lspawn/ (${n_face} entries, detail/ and the public headers)")

set(torch_dir_arg "")
if(TORCH_DIR)
  set(torch_dir_arg "-DTorch_DIR=${TORCH_DIR}")
  # TorchConfig.cmake finds its Caffe2 with find_package(Caffe2 PATHS <beside it>), where the
  # system's own paths come first: on a machine with Debian's LibTorch too (this one), a 2.x Torch
  # would get 1.13's Caffe2 and its libraries. The one beside the Torch the build found, then.
  get_filename_component(caffe2_dir "${TORCH_DIR}/../Caffe2" ABSOLUTE)
  if(EXISTS ${caffe2_dir}/Caffe2Config.cmake)
    list(APPEND torch_dir_arg "-DCaffe2_DIR=${caffe2_dir}")
  endif()
endif()
set(launcher_arg "")
set(build_env "")
if(CCACHE)
  set(launcher_arg "-DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE}")
  set(build_env ${CMAKE_COMMAND} -E env
    CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
    CCACHE_BASEDIR=${CCACHE_BASEDIR} CCACHE_NOHASHDIR=1)
endif()
step("configure the consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${work}/build -G ${GENERATOR}
  -DCMAKE_PREFIX_PATH=${work}/prefix "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}" ${launcher_arg} ${torch_dir_arg})
# The configure compiled <lspawn/spawn.hpp> and refused the parts' headers (project/CMakeLists.txt).
foreach(line "consumer: <lspawn/spawn.hpp> compiles"
             "consumer: #include \"proto/wire.hpp\" is not on the include path"
             "consumer: #include \"spawn/options.hpp\" is not on the include path")
  string(FIND "${step_output}" "${line}" at)
  if(at EQUAL -1)
    fail("the consumer's configure did not say '${line}':\n${step_output}")
  endif()
endforeach()
step("build the consumer" ${build_env} ${CMAKE_COMMAND} --build ${work}/build -j 2)
# Runs a program of the consumer and fails unless its output says `ok_line`.
function(run_program program ok_line)
  step("run ${program}" ${work}/build/${program})
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "${ok_line}")
    file(REMOVE_RECURSE ${work})
    message(FATAL_ERROR "consumer test: unexpected output of ${program}:\n${step_output}")
  endif()
endfunction()

run_program(consumer_app "consumer: OK")
# The worker side: built when the install has the torch parts (worker.cpp).
if(EXISTS ${work}/build/consumer_worker)
  run_program(consumer_worker "consumer worker: OK")
elseif(EXISTS ${inc}/lspawn/strategies.hpp)
  fail("the install has the torch parts but consumer_worker was not built")
endif()
file(REMOVE_RECURSE ${work})
