# Fails when a public header (lspawn/*.hpp) reaches, through its includes, a header that only
# lspawn's implementation needs (LSPAWN_IMPLEMENTATION_HEADERS of cmake/parts.cmake: the fork
# loop, the Supervisor, the store gate, torch_compat.hpp, spawn/init_detail.hpp, ...), and names
# the chain of includes that reaches it. A grep of the #include lines, no compilation. The same
# closure is what the install ships (cmake/install.cmake), and it fails there too.
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
# Breadth first over the headers of the tree that the public ones include, as the install does
# (cmake/public_face.cmake installs this closure); seen_via_<header> is the chain that first
# reached it.
include(${SOURCE_DIR}/cmake/public_face.cmake)
lspawn_header_closure(seen SOURCE_DIR "${SOURCE_DIR}" HEADERS ${public})
set(found "")
foreach(h ${seen})
  list(FIND LSPAWN_IMPLEMENTATION_HEADERS "${h}" _internal)
  if(_internal GREATER -1)
    string(APPEND found "  ${seen_via_${h}}\n")
  endif()
endforeach()
list(LENGTH public n_public)
list(LENGTH seen n_seen)
if(found)
  message(FATAL_ERROR "public headers reach headers only lspawn's implementation needs "
                      "(cmake/parts.cmake, LSPAWN_IMPLEMENTATION_HEADERS):\n${found}")
endif()
message(STATUS "${n_public} public headers reach ${n_seen} of lspawn's headers, none of the implementation's")
