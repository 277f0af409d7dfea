# Installs the lspawn build at BUILD_DIR into a fresh temporary prefix, configures and builds
# the consumer project (SOURCE_DIR) against it with find_package(lspawn), and runs it: the
# torch-free consumer_app and, when the install has the torch parts, consumer_worker.
# Arguments: -DBUILD_DIR= -DSOURCE_DIR= -DGENERATOR= [-DCXX_FLAGS=] [-DLINK_FLAGS=]
# [-DTORCH_DIR=]: the Torch_DIR the build found, handed on so the consumer finds the same Torch
# however the build found it (a multi-entry CMAKE_PREFIX_PATH, a Torch_DIR on the command line).
# [-DCCACHE= -DCCACHE_BASEDIR=]: compile through ccache, with the build's settings.
foreach(v BUILD_DIR SOURCE_DIR GENERATOR)
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
if(NOT EXISTS ${work}/prefix/include/lspawn/lspawn/spawn.hpp)
  message(FATAL_ERROR "consumer test: the install has no include/lspawn/lspawn/spawn.hpp")
endif()
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
elseif(EXISTS ${work}/prefix/include/lspawn/lspawn/strategies.hpp)
  file(REMOVE_RECURSE ${work})
  message(FATAL_ERROR "consumer test: the install has the torch parts but consumer_worker was not built")
endif()
file(REMOVE_RECURSE ${work})
