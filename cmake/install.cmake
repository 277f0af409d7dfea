# Install and export of every lspawn library as lspawn::<name>, plus the lspawn binary, the
# public headers (<prefix>/include/lspawn/*.hpp, and what they include under
# <prefix>/include/lspawn/detail/: cmake/public_face.cmake) and a CMake package config:
#
#   find_package(lspawn CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE lspawn::spawn)        # or spawn_torch, runtime, ...
#   #include <lspawn/spawn.hpp>                             # <lspawn/...> and nothing else
#
# Exported names, one per part (docs/architecture.md): lspawn::proto, lspawn::sys, lspawn::placement,
# lspawn::status, lspawn::supervisor, lspawn::hang, lspawn::spawn, lspawn::forkserver_hook,
# lspawn::launchenv, lspawn::cluster, lspawn::daemon, lspawn::launcher (the command line; it links
# every torch-free part, as the lspawn::launcher of 0.1 did), lspawn::runtime, lspawn::spawn_torch,
# lspawn::shm (0.2's lspawn::collectives_shm), lspawn::engine, lspawn::collectives,
# lspawn::strategies, lspawn::lspawn (the CLI binary). Each has one include directory once
# installed, <prefix>/include.
# Included by the top-level CMakeLists.txt after every part was added.
include(CMakePackageConfigHelpers)

set(LSPAWN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/lspawn)

set(_lspawn_exported)
foreach(_t lspawn_gloo_headers lspawn_proto lspawn_sys lspawn_placement lspawn_status lspawn_supervisor lspawn_hang lspawn_spawn lspawn_forkserver_hook
           lspawn_launchenv lspawn_cluster lspawn_daemon lspawn_launcher lspawn_runtime lspawn_spawn_torch
           lspawn_shm lspawn_engine lspawn_collectives lspawn_strategies)
  if(TARGET ${_t})
    string(REGEX REPLACE "^lspawn_" "" _name ${_t})
    set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
    # Installed, a target's include directory is <prefix>/include, where <lspawn/...> resolves
    # and no part's folder does. The parts name only their BUILD_INTERFACE directory; an
    # $<INSTALL_INTERFACE:...> one would bring back include/lspawn (which made "proto/...",
    # "spawn/..." top-level names in a program), so any is dropped here.
    get_target_property(_dirs ${_t} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs)
      list(FILTER _dirs EXCLUDE REGEX "^\\$<INSTALL_INTERFACE:")
      set_property(TARGET ${_t} PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${_dirs})
    endif()
    target_include_directories(${_t} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    list(APPEND _lspawn_exported ${_t})
  endif()
endforeach()
if(TARGET lspawn)
  set_target_properties(lspawn PROPERTIES EXPORT_NAME lspawn)
  list(APPEND _lspawn_exported lspawn)
endif()

install(TARGETS ${_lspawn_exported}
  EXPORT lspawnTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers: the public face alone (cmake/public_face.cmake), <prefix>/include/lspawn/*.hpp and the
# part headers they reach under <prefix>/include/lspawn/detail/, with their includes rewritten to
# those paths. Staged at install time from the source tree as it is then (an edited header needs no
# reconfigure), in a directory of this install's own (two `cmake --install`s of one build run at
# once under ctest -j), then installed by file(INSTALL), as install(DIRECTORY) does (DESTDIR,
# install_manifest.txt). The headers only lspawn's implementation needs
# (LSPAWN_IMPLEMENTATION_HEADERS) and the other part headers are not installed: a program includes
# <lspawn/...> and nothing else (docs/using-lspawn-from-cmake.md).
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(_lspawn_face_dest "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(_lspawn_face_dest "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
install(CODE "
  include(\"${CMAKE_CURRENT_LIST_DIR}/public_face.cmake\")
  string(RANDOM LENGTH 12 _lspawn_face_id)
  set(_lspawn_face_stage \"${PROJECT_BINARY_DIR}/public-face/\${_lspawn_face_id}\")
  lspawn_stage_public_face(SOURCE_DIR \"${PROJECT_SOURCE_DIR}\" STAGE_DIR \"\${_lspawn_face_stage}\"
    PARTS ${_parts} IMPLEMENTATION_HEADERS ${LSPAWN_IMPLEMENTATION_HEADERS})
  file(INSTALL DESTINATION \"${_lspawn_face_dest}\" TYPE DIRECTORY FILES \"\${_lspawn_face_stage}/lspawn\")
  file(REMOVE_RECURSE \"\${_lspawn_face_stage}\")")

install(EXPORT lspawnTargets
  NAMESPACE lspawn::
  DESTINATION ${LSPAWN_INSTALL_CMAKEDIR})

set(LSPAWN_CONFIG_WITH_GLOO OFF)
if(TARGET gloo)
  set(LSPAWN_CONFIG_WITH_GLOO ON)
endif()
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/lspawnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/lspawnConfig.cmake
  INSTALL_DESTINATION ${LSPAWN_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/lspawnConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/lspawnConfig.cmake
  ${PROJECT_BINARY_DIR}/lspawnConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/TorchCpuOnly.cmake
  DESTINATION ${LSPAWN_INSTALL_CMAKEDIR})
