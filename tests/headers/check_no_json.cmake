# Fails when a header of lspawn's parts names nlohmann (an include of it, nlohmann::json in a
# signature, an NLOHMANN_ macro). Why: a target that includes such a header compiles against
# whichever nlohmann its own include path finds, and nlohmann's types carry the version in
# their mangled names (inline namespace json_abi_v3_11_N). On a machine with two nlohmann
# versions (a system /usr/include 3.11.3 and the package CMake found, 3.11.2) `lspawn` (cli.cpp)
# and the library under it (then lspawn_launcher, now lspawn_cluster) were compiled against different ones, and the link failed:
#   undefined reference to lspawn::node::Group::send_hang_message(..., nlohmann::json_abi_v3_11_3::basic_json ...)
#   (node::Group is node::NodeGroup now)
# JSON stays inside the .cpp files that encode or decode (proto/wire.cpp, which also encodes the
# control channel's messages, supervisor/error_file.cpp, strategies/spawn_strategies.cpp).
# Usage: cmake -DSOURCE_DIR=<repo> -P check_no_json.cmake
include(${SOURCE_DIR}/cmake/parts.cmake)
set(parts ${LSPAWN_PARTS})
set(found "")
set(count 0)
foreach(part ${parts})
  file(GLOB_RECURSE headers "${SOURCE_DIR}/${part}/*.hpp" "${SOURCE_DIR}/${part}/*.h")
  foreach(h ${headers})
    math(EXPR count "${count} + 1")
    file(READ "${h}" text)
    # Comments may name it (to say where JSON lives): strip /* */ blocks, then // to line end.
    string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" code "${text}")
    string(REGEX REPLACE "//[^\n]*" "" code "${code}")
    string(REGEX MATCHALL "[^\n]*(nlohmann|NLOHMANN_)[^\n]*" hits "${code}")
    foreach(hit ${hits})
      file(RELATIVE_PATH rel "${SOURCE_DIR}" "${h}")
      string(STRIP "${hit}" hit)
      string(APPEND found "  ${rel}: ${hit}\n")
    endforeach()
  endforeach()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "no headers found under ${SOURCE_DIR} (parts: ${parts})")
endif()
if(found)
  message(FATAL_ERROR "headers that other targets include name nlohmann (keep JSON inside the .cpp files; "
                      "docs/architecture.md):\n${found}")
endif()
message(STATUS "${count} headers checked: none names nlohmann")
