# Install and export of every lspawn library as lspawn::<name>, plus the lspawn binary, the
# headers (under <prefix>/include/lspawn, so that <lspawn/spawn.hpp>, "launcher/...",
# "runtime/...", "proto/messages.hpp" resolve) and a CMake package config:
#
#   find_package(lspawn CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE lspawn::spawn)        # or spawn_torch, runtime, ...
#
# Exported names: lspawn::proto, lspawn::launcher, lspawn::spawn, lspawn::runtime,
# lspawn::spawn_torch, lspawn::collectives_shm, lspawn::collectives, lspawn::strategies,
# lspawn::lspawn (the CLI).
# Included by the top-level CMakeLists.txt after every part was added.
include(CMakePackageConfigHelpers)

set(LSPAWN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/lspawn)
set(LSPAWN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/lspawn)

set(_lspawn_exported)
foreach(_t lspawn_gloo_headers lspawn_proto lspawn_status lspawn_launcher lspawn_spawn lspawn_forkserver_hook lspawn_runtime lspawn_spawn_torch
           lspawn_collectives_shm lspawn_collectives lspawn_strategies)
  if(TARGET ${_t})
    string(REGEX REPLACE "^lspawn_" "" _name ${_t})
    set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
    target_include_directories(${_t} INTERFACE $<INSTALL_INTERFACE:${LSPAWN_INSTALL_INCLUDEDIR}>)
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

# Headers keep their place in the tree: the include root of the build is the include root of
# the install.
foreach(_dir lspawn launcher runtime collectives strategies proto status)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/
      DESTINATION ${LSPAWN_INSTALL_INCLUDEDIR}/${_dir}
      FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
  endif()
endforeach()

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
