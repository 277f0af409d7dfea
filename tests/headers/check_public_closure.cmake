# Fails when a public header (lspawn/*.hpp) reaches, through its includes, a header that only
# lspawn's implementation needs (LSPAWN_IMPLEMENTATION_HEADERS of cmake/parts.cmake: the fork
# loop, the Supervisor, the store gate, torch_compat.hpp, spawn/init_detail.hpp, ...), and names
# the chain of includes that reaches it. A grep of the #include lines, no compilation.
# Usage: cmake -DSOURCE_DIR=<repo> -P check_public_closure.cmake
include(${SOURCE_DIR}/cmake/parts.cmake)  # LSPAWN_IMPLEMENTATION_HEADERS
foreach(h ${LSPAWN_IMPLEMENTATION_HEADERS})
  if(NOT EXISTS "${SOURCE_DIR}/${h}")
    message(FATAL_ERROR "cmake/parts.cmake names ${h} in LSPAWN_IMPLEMENTATION_HEADERS, which does not exist")
  endif()
endforeach()

file(GLOB public RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/lspawn/*.hpp")
if(NOT public)
  message(FATAL_ERROR "no public header found in ${SOURCE_DIR}/lspawn")
endif()
# Breadth first over the headers of the tree that the public ones include; via_<header> is the
# chain of includes that first reached it.
set(queue ${public})
set(seen ${public})
foreach(h ${public})
  set(via_${h} "${h}")
endforeach()
set(found "")
while(queue)
  list(POP_FRONT queue h)
  file(STRINGS "${SOURCE_DIR}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"]+[>\"]")
  foreach(line ${lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*" "\\1" path "${line}")
    if(NOT EXISTS "${SOURCE_DIR}/${path}" OR IS_DIRECTORY "${SOURCE_DIR}/${path}")
      continue()  # a system or LibTorch header
    endif()
    list(FIND seen "${path}" _seen)
    if(_seen GREATER -1)
      continue()
    endif()
    list(APPEND seen "${path}")
    list(APPEND queue "${path}")
    set(via_${path} "${via_${h}} -> ${path}")
    list(FIND LSPAWN_IMPLEMENTATION_HEADERS "${path}" _internal)
    if(_internal GREATER -1)
      string(APPEND found "  ${via_${path}}\n")
    endif()
  endforeach()
endwhile()
list(LENGTH public n_public)
list(LENGTH seen n_seen)
if(found)
  message(FATAL_ERROR "public headers reach headers only lspawn's implementation needs "
                      "(cmake/parts.cmake, LSPAWN_IMPLEMENTATION_HEADERS):\n${found}")
endif()
message(STATUS "${n_public} public headers reach ${n_seen} of lspawn's headers, none of the implementation's")
