// GlooGuard: gloo's TCP connections admitted only from processes that hold the job's secret.
//
// Why: gloo's tcp transport accepts whoever connects to its listeners. On LibTorch 1.13 (gloo of
// 2022) each pair listens on a port of its own while the group connects and takes the *first*
// connection it accepts as its peer: a stranger that connects first becomes the pair (its bytes
// are read as gloo messages) and the real peer is refused, so the job fails. On 2.x one listener
// per device lives as long as the group; each connection's first 8 bytes name the pair it is for,
// so garbage is kept as an unknown sequence number, silently, and a stranger that sends a small
// number can take a pair's place before the real peer. Either way nothing says what happened.
//
// What the guard does, once installed (a job with LSPAWN_JOB_SECRET; docs/security.md):
//
//   - A rank that opens a gloo connection sends a connection token first
//     (RecordAuth::connection_token: a nonce and its HMAC under the job's secret), before gloo
//     writes anything.
//   - A gloo listener's accept() reads the token before gloo sees the connection. A connection
//     without a valid token (wrong bytes, another secret, a token seen before, closed early,
//     nothing sent within kGlooTokenWait) is closed and named on stderr:
//       [lspawn] rank 0/3: gloo at 127.0.0.1:40123 refused a connection from 127.0.0.1:51234:
//       not an lspawn connection token (first bytes 47 45 54 20); the job goes on
//     and gloo is given the next connection instead. On 2.x accept() returns the next pending
//     one, or EAGAIN, as gloo expects from its non-blocking listener. On 1.13 the pair takes
//     whatever accept() returns as its peer and closes its listener, and its real peer may come
//     later or never (when this side of the pair is the one to connect out): accept() returns a
//     stand-in connection made to the listener itself (so its local address is the listener's,
//     which gloo compares with the peer's to decide which side connects out), keeps the listener
//     open, and a thread of lspawn's relays between the two once the real peer has connected there
//     (with its token), or ends when gloo closes the stand-in first. Only a pair a stranger got to
//     first is relayed.
//
// Which sockets: the listening sockets bound, and the TCP connections opened, on a thread while a
// GlooSetupScope is alive there (lspawn wraps the creation of every gloo device and process group
// in one), plus later connections to the same destinations (gloo 2.x retries a refused connect
// from its loop thread). Every other socket of the process is left alone.
//
// How: lspawn_runtime defines accept(), accept4() and connect() (runtime/socket_calls.hpp, with
// bind()), which forward to the system calls and call the guard for gloo's sockets. They take
// effect when the runtime is linked into the executable with its symbols exported (ENABLE_EXPORTS,
// as every lspawn program is built): gloo, in libgloo (1.13) or libtorch_cpu (2.x), then calls
// them instead of libc's. install() checks that they do and, where not, leaves gloo unguarded
// (active() is false) with one warning; every rank of a job runs the same binary, so tokens are
// then neither sent nor expected anywhere. The same with TORCH_GLOO_LAZY_INIT set (2.x connects
// pairs at first use, outside any scope).
//
// The state is process-wide by necessity: accept() and connect() are called by gloo, which
// cannot pass lspawn anything. install() is idempotent for the process's secret.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "runtime/record_auth.hpp"

namespace lspawn {

// How long an accepted gloo connection may take to send its token. A rank sends it as soon as
// its connect() completes, before the listener's accept() usually runs; a connection that sends
// nothing holds gloo's loop thread (which on 2.x also carries the pairs' traffic) this long.
// On a link whose measured round trip is long the wait is longer: gloo_token_wait().
inline constexpr std::chrono::milliseconds kGlooTokenWait{2000};
// The wait for the token of accepted connection `fd`: kGlooTokenWait, or twice the kernel's
// retransmission timeout for its measured round trip (sys::tcp_retransmission_estimate) when
// that is longer, 60 s at most. A token whose segment is lost once is resent after that timeout:
// with 2 s one way and 20 % loss a fixed 2 s refused real ranks and failed the job
// (docs/reliability.md, "Slow and lossy links"). A stranger on a fast link still gets 2 s.
std::chrono::milliseconds gloo_token_wait(int fd);

// How long a rank's connect() to a gloo listener waits for the connection to complete so it can
// send its token (a refused connection returns at once, untouched, for gloo to handle); and, on
// 1.13, how long a pair's accept() waits for its stand-in to come through a full accept queue.
inline constexpr std::chrono::milliseconds kGlooConnectWait{30000};

// After this many refusal messages, further refusals are counted, not printed (a flood of
// strangers cannot fill the log).
inline constexpr int kGlooRefusalsPrinted = 20;

class GlooGuard {
 public:
  // Guards this process's gloo connections with `auth` from now on; `who` ("rank 1/4") prefixes
  // the messages. Idempotent; a second install with another secret throws std::logic_error.
  static void install(const RecordAuth& auth, const std::string& who);
  // install() from LSPAWN_JOB_SECRET when it is set; nothing when it is not.
  static void install_from_environment(const std::string& who);
  // Whether the guard is installed and its accept()/connect() are the ones gloo calls.
  static bool active();
  // Connections refused since the process started.
  static uint64_t refused();
  // Tokens sent / accepted since the process started (for tests and the fault matrix).
  static uint64_t sent();
  static uint64_t admitted();
  // 1.13: stand-in connections given to gloo's pairs after a refusal (each relayed to the real
  // peer if it connects).
  static uint64_t stand_ins();
};

// While alive, the TCP sockets this thread binds (gloo's listeners) and connects (gloo's pairs)
// are gloo's: see above. Nests; one per thread at a time is what lspawn uses.
class GlooSetupScope {
 public:
  GlooSetupScope();
  ~GlooSetupScope();
  GlooSetupScope(const GlooSetupScope&) = delete;
  GlooSetupScope& operator=(const GlooSetupScope&) = delete;
};

}  // namespace lspawn
