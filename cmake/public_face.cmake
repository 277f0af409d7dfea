# lspawn's public face: the public headers (lspawn/*.hpp) and the part headers they reach through
# their includes (their closure). Read by cmake/install.cmake, which installs that closure and
# nothing else, and by tests/headers/check_public_closure.cmake. Plain functions only: it is also
# read in script mode (cmake -P) and at install time, where no policy is set: no IN_LIST.
#
# Installed layout (docs/using-lspawn-from-cmake.md, "Install"), under <prefix>/include, the one
# include directory of every exported target:
#   lspawn/<name>.hpp              the public headers: what a program includes, <lspawn/spawn.hpp>
#   lspawn/detail/<part>/<h>.hpp   the part headers they reach, with their includes of each other
#                                  rewritten to <lspawn/detail/<part>/<h>.hpp> and <lspawn/<name>.hpp>
# so that no part's folder ("proto/", "spawn/", "status/", "sys/", ...) is a top-level name on a
# program's include path, and the headers only lspawn's implementation needs
# (LSPAWN_IMPLEMENTATION_HEADERS of cmake/parts.cmake, proto/wire.hpp, ...) are not installed.

# lspawn_header_closure(<out> SOURCE_DIR <dir> HEADERS <h>...): <out> is HEADERS and every header of
# the tree at SOURCE_DIR that they reach through their #include lines (paths relative to SOURCE_DIR,
# breadth first); <out>_via_<h> is the chain of includes that first reached <h> ("lspawn/spawn.hpp
# -> spawn/spawn.hpp -> ..."). An include that names no file of the tree (the C library's
# <sys/types.h>, LibTorch's <ATen/ATen.h>) is not followed. A grep, no preprocessor.
function(lspawn_header_closure out)
  cmake_parse_arguments(arg "" "SOURCE_DIR" "HEADERS" ${ARGN})
  set(queue ${arg_HEADERS})
  set(seen ${arg_HEADERS})
  foreach(h ${arg_HEADERS})
    set(via_${h} "${h}")
  endforeach()
  while(queue)
    list(POP_FRONT queue h)
    file(STRINGS "${arg_SOURCE_DIR}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"]+[>\"]")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*" "\\1" path "${line}")
      if(NOT EXISTS "${arg_SOURCE_DIR}/${path}" OR IS_DIRECTORY "${arg_SOURCE_DIR}/${path}")
        continue()
      endif()
      list(FIND seen "${path}" _seen)
      if(_seen GREATER -1)
        continue()
      endif()
      list(APPEND seen "${path}")
      list(APPEND queue "${path}")
      set(via_${path} "${via_${h}} -> ${path}")
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
  foreach(h ${seen})
    set(${out}_via_${h} "${via_${h}}" PARENT_SCOPE)
  endforeach()
endfunction()

# Where the installed copy of the tree's header <h> lies under <prefix>/include, and how the other
# installed headers include it: lspawn/<name>.hpp stays; a part's header goes under lspawn/detail/.
function(lspawn_installed_header_path out h)
  if(h MATCHES "^lspawn/")
    set(${out} "${h}" PARENT_SCOPE)
  else()
    set(${out} "lspawn/detail/${h}" PARENT_SCOPE)
  endif()
endfunction()

# lspawn_stage_public_face(SOURCE_DIR <dir> STAGE_DIR <dir> PARTS <part>... IMPLEMENTATION_HEADERS <h>...)
# Writes the installed include tree into STAGE_DIR (emptied first): each public header lspawn/*.hpp
# whose closure lies in PARTS (the parts built: a launcher-only build has <lspawn/spawn.hpp> and
# not <lspawn/runtime.hpp>), and the part headers of those closures, at
# lspawn_installed_header_path() and with their includes of each other rewritten to it. Fails,
# naming the chain of includes, when a public header reaches one of IMPLEMENTATION_HEADERS.
function(lspawn_stage_public_face)
  cmake_parse_arguments(arg "" "SOURCE_DIR;STAGE_DIR" "PARTS;IMPLEMENTATION_HEADERS" ${ARGN})
  file(GLOB public RELATIVE "${arg_SOURCE_DIR}" "${arg_SOURCE_DIR}/lspawn/*.hpp")
  if(NOT public)
    message(FATAL_ERROR "lspawn: no public header found in ${arg_SOURCE_DIR}/lspawn")
  endif()
  set(installed "")
  set(leaks "")
  foreach(p ${public})
    lspawn_header_closure(reach SOURCE_DIR "${arg_SOURCE_DIR}" HEADERS ${p})
    set(built TRUE)
    foreach(h ${reach})
      string(REGEX REPLACE "/.*" "" part "${h}")
      list(FIND arg_PARTS "${part}" _built)
      if(NOT part STREQUAL "lspawn" AND _built EQUAL -1)
        set(built FALSE)  # reaches a part this build leaves out (LSPAWN_LAUNCHER_ONLY)
      endif()
      list(FIND arg_IMPLEMENTATION_HEADERS "${h}" _internal)
      if(_internal GREATER -1)
        string(APPEND leaks "  ${reach_via_${h}}\n")
      endif()
    endforeach()
    if(built)
      list(APPEND installed ${reach})
    endif()
  endforeach()
  if(leaks)
    message(FATAL_ERROR "lspawn: the public headers reach headers only lspawn's implementation "
                        "needs (cmake/parts.cmake, LSPAWN_IMPLEMENTATION_HEADERS):\n${leaks}")
  endif()
  list(REMOVE_DUPLICATES installed)

  file(REMOVE_RECURSE "${arg_STAGE_DIR}")
  foreach(h ${installed})
    file(READ "${arg_SOURCE_DIR}/${h}" text)
    foreach(dep ${installed})
      if(NOT dep MATCHES "^[A-Za-z0-9_/.-]+$")
        message(FATAL_ERROR "lspawn: a header path this install cannot rewrite: ${dep}")
      endif()
      string(REPLACE "." "\\." dep_re "${dep}")
      lspawn_installed_header_path(to ${dep})
      string(REGEX REPLACE "(#[ \t]*include[ \t]*)[<\"]${dep_re}[>\"]" "\\1<${to}>" text "${text}")
    endforeach()
    lspawn_installed_header_path(to ${h})
    file(WRITE "${arg_STAGE_DIR}/${to}" "${text}")
  endforeach()
  list(LENGTH installed n)
  message(STATUS "lspawn: the public face, ${n} headers (cmake/public_face.cmake)")
endfunction()
