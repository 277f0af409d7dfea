// The first thing an exec'd forkserver does (Forkserver::exec(), forkserver.hpp): take the two
// fds lspawn named in LSPAWN_FORKSERVER_FDS, then say "ready" (one ForkReply with index -1 and
// its pid) or refuse (the same reply with the reason in `error`; lspawn reports it and the
// server exits). Both servers that lspawn executes use it: the C++ forkserver hook
// (forkserver_hook.hpp, from a static constructor) and the Python preload server
// (python_preload_entry.hpp, called by python/lspawn_preload.py).
#pragma once

#include <optional>
#include <string>

namespace lspawn::forkserver_handshake {

struct Fds {
  int requests = -1;  // the request socket (unix stream)
  int exits = -1;     // the write end of the exit pipe
};

// Reads LSPAWN_FORKSERVER_FDS ("REQUEST_SOCKET,EXIT_PIPE") and unsets it (a worker must not see
// it), and marks both fds close-on-exec. nullopt when it is not set (not started by lspawn).
// Throws std::runtime_error naming the value when it is malformed or an fd is not open.
std::optional<Fds> take_fds();

// Sends the ready reply (`refusal` empty) or the refusal. Throws wire::WireError /
// sys::SysError when lspawn is gone.
void answer(const Fds& fds, const std::string& refusal);

}  // namespace lspawn::forkserver_handshake
