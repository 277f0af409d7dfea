# lspawn's parts, in layer order, and what each may include: the table of docs/architecture.md
# ("Parts and layers") as CMake lists, read by the build (CMakeLists.txt, cmake/install.cmake)
# and by the tests that grep the tree (tests/headers/check_layering.cmake, check_no_json.cmake).
# A new part is added here, once. Plain set() only: it is also read in script mode (cmake -P).
set(LSPAWN_PARTS proto sys placement status shm launchenv supervisor hang spawn cluster daemon launcher runtime collectives strategies lspawn)
# The parts that never include (or link) LibTorch.
set(LSPAWN_TORCH_FREE_PARTS proto sys placement status shm launchenv supervisor hang spawn cluster daemon launcher)
# LSPAWN_MAY_<part>: the parts <part> may include, besides itself.
set(LSPAWN_MAY_proto)
set(LSPAWN_MAY_sys proto)
set(LSPAWN_MAY_placement proto)
set(LSPAWN_MAY_status)
set(LSPAWN_MAY_shm status sys proto)
set(LSPAWN_MAY_launchenv sys proto)
set(LSPAWN_MAY_supervisor sys proto placement)
set(LSPAWN_MAY_hang supervisor sys status proto placement)
set(LSPAWN_MAY_spawn hang supervisor sys status proto placement)
set(LSPAWN_MAY_cluster hang supervisor sys status proto placement)
set(LSPAWN_MAY_daemon spawn hang supervisor sys status proto placement)
set(LSPAWN_MAY_launcher daemon cluster launchenv spawn hang supervisor sys status proto placement)
set(LSPAWN_MAY_runtime launchenv spawn hang supervisor sys status proto placement)
set(LSPAWN_MAY_collectives runtime launchenv spawn hang supervisor sys status shm proto placement)
set(LSPAWN_MAY_strategies collectives runtime launchenv spawn hang supervisor sys status shm proto placement)
set(LSPAWN_MAY_lspawn strategies collectives runtime launchenv spawn hang supervisor sys status shm proto placement)
# Headers only lspawn's implementation includes: no public header (lspawn/*.hpp) may reach them,
# directly or through another header (tests/headers/check_public_closure.cmake). They are not
# installed (cmake/public_face.cmake); a program never needs them (docs/using-lspawn-from-cmake.md).
set(LSPAWN_IMPLEMENTATION_HEADERS
  proto/wire.hpp proto/node_wire.hpp proto/schema.hpp
  supervisor/supervisor.hpp supervisor/guardian.hpp supervisor/env_contract.hpp
  spawn/init_detail.hpp spawn/fork_loop.hpp spawn/forked_workers.hpp spawn/worker.hpp spawn/threads.hpp
  runtime/rendezvous.hpp runtime/store_gate.hpp runtime/store_listener.hpp runtime/authenticated_store.hpp
  runtime/record_auth.hpp runtime/gloo_guard.hpp runtime/gloo_loop_ticker.hpp runtime/throw_trace.hpp
  runtime/torch_compat.hpp runtime/torch_compat_reducer.hpp runtime/recorded_backend.hpp
  collectives/hierarchy.hpp collectives/cuda_ipc.hpp shm/communicator.hpp)
