# Install and export of every lspawn library as lspawn::<name>, plus the lspawn binary, the
# headers (under <prefix>/include/lspawn, so that <lspawn/spawn.hpp>, "supervisor/...",
# "runtime/...", "proto/messages.hpp" resolve) and a CMake package config:
#
#   find_package(lspawn CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE lspawn::spawn)        # or spawn_torch, runtime, ...
#
# Exported names, one per part (docs/architecture.md): lspawn::proto, lspawn::placement, lspawn::status,
# lspawn::supervisor, lspawn::hang, lspawn::spawn, lspawn::forkserver_hook, lspawn::cluster,
# lspawn::daemon, lspawn::launcher (the command line; it links every torch-free part, as the
# lspawn::launcher of 0.1 did), lspawn::runtime, lspawn::spawn_torch, lspawn::shm (0.2's lspawn::collectives_shm), lspawn::engine,
# lspawn::collectives, lspawn::strategies, lspawn::lspawn (the CLI binary).
# Included by the top-level CMakeLists.txt after every part was added.
include(CMakePackageConfigHelpers)

set(LSPAWN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/lspawn)
set(LSPAWN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/lspawn)

set(_lspawn_exported)
foreach(_t lspawn_gloo_headers lspawn_proto lspawn_sys lspawn_placement lspawn_status lspawn_supervisor lspawn_hang lspawn_spawn lspawn_forkserver_hook
           lspawn_launchenv lspawn_cluster lspawn_daemon lspawn_launcher lspawn_runtime lspawn_spawn_torch
           lspawn_shm lspawn_engine lspawn_collectives lspawn_strategies)
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
foreach(_dir ${_parts})  # the parts built (the torch-free ones alone with LSPAWN_LAUNCHER_ONLY)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${_dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/
      DESTINATION ${LSPAWN_INSTALL_INCLUDEDIR}/${_dir}
      FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
  endif()
endforeach()

# Headers that lspawn 0.1 installed elsewhere (before launcher/ was split into its parts) keep
# working until 0.3: at the old path, a header that says where it went and includes it.
set(_lspawn_moved_headers
  supervisor/sys.hpp sys/sys.hpp
  supervisor/epoll.hpp sys/epoll.hpp
  supervisor/fd_frame.hpp sys/fd_frame.hpp
  supervisor/remove_tree.hpp sys/remove_tree.hpp
  supervisor/duration_text.hpp sys/duration_text.hpp
  supervisor/exit_codes.hpp sys/exit_codes.hpp
  cluster/launch_env.hpp launchenv/launch_env.hpp
  cluster/slurm_hostlist.hpp launchenv/slurm_hostlist.hpp
  cluster/slurm_tasks_per_node.hpp launchenv/slurm_tasks_per_node.hpp
  cluster/env_syntax_error.hpp launchenv/env_syntax_error.hpp
  launcher/sys.hpp sys/sys.hpp
  collectives/shm/communicator.hpp shm/communicator.hpp
  collectives/shm/reduce_kernels.hpp shm/reduce_kernels.hpp
  launcher/fd_frame.hpp sys/fd_frame.hpp
  launcher/guardian.hpp supervisor/guardian.hpp
  launcher/guardian_loop.hpp supervisor/guardian_loop.hpp
  launcher/output.hpp supervisor/output.hpp
  launcher/supervisor.hpp supervisor/supervisor.hpp
  launcher/error_file.hpp supervisor/error_file.hpp
  launcher/env_contract.hpp supervisor/env_contract.hpp
  launcher/port.hpp supervisor/port.hpp
  launcher/job_secret.hpp supervisor/job_secret.hpp
  launcher/version.hpp supervisor/version.hpp
  launcher/hang_watch.hpp hang/hang_watch.hpp
  launcher/hang_report.hpp hang/hang_report.hpp
  launcher/status_command.hpp hang/status_command.hpp
  launcher/elf.hpp spawn/elf.hpp
  launcher/node_channel.hpp cluster/node_channel.hpp
  launcher/node_group.hpp cluster/node_group.hpp
  launcher/launch_env.hpp launchenv/launch_env.hpp
  launcher/slurm_hostlist.hpp launchenv/slurm_hostlist.hpp
  launcher/slurm_tasks_per_node.hpp launchenv/slurm_tasks_per_node.hpp
  launcher/env_syntax_error.hpp launchenv/env_syntax_error.hpp
  launcher/daemon.hpp daemon/daemon.hpp
  launcher/daemon_client.hpp daemon/daemon_client.hpp
  launcher/spawn/codec.hpp spawn/codec.hpp
  launcher/spawn/errors.hpp spawn/errors.hpp
  launcher/spawn/fork_loop.hpp spawn/fork_loop.hpp
  launcher/spawn/forked_workers.hpp spawn/forked_workers.hpp
  launcher/spawn/forkserver.hpp spawn/forkserver.hpp
  launcher/spawn/forkserver_handshake.hpp spawn/forkserver_handshake.hpp
  launcher/spawn/forkserver_hook.hpp spawn/forkserver_hook.hpp
  launcher/spawn/init.hpp spawn/init.hpp
  launcher/spawn/options.hpp spawn/options.hpp
  launcher/spawn/process_context.hpp spawn/process_context.hpp
  launcher/spawn/python_preload_entry.hpp spawn/python_preload_entry.hpp
  launcher/spawn/registry.hpp spawn/registry.hpp
  launcher/spawn/serial_executor.hpp spawn/serial_executor.hpp
  launcher/spawn/spawn.hpp spawn/spawn.hpp
  launcher/spawn/threads.hpp spawn/threads.hpp
  launcher/spawn/worker.hpp spawn/worker.hpp)
while(_lspawn_moved_headers)
  list(POP_FRONT _lspawn_moved_headers _old _new)
  set(_fwd ${PROJECT_BINARY_DIR}/moved-headers/${_old})
  file(WRITE ${_fwd}.tmp
    "// Deprecated: lspawn 0.2 moved this header to \"${_new}\" (docs/architecture.md).\n"
    "// This forwarding header is removed in lspawn 0.3.\n"
    "#pragma once\n"
    "#pragma message(\"lspawn: \\\"${_old}\\\" moved to \\\"${_new}\\\"; include that instead\")\n"
    "#include \"${_new}\"\n")
  configure_file(${_fwd}.tmp ${_fwd} COPYONLY)
  get_filename_component(_old_dir ${_old} DIRECTORY)
  install(FILES ${_fwd} DESTINATION ${LSPAWN_INSTALL_INCLUDEDIR}/${_old_dir})
endwhile()

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
