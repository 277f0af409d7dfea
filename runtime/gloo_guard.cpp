#include "runtime/gloo_guard.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/socket_calls.hpp"
#include "sys/sys.hpp"
#include "sys/duration_text.hpp"
#include "runtime/torch_compat.hpp"

namespace lspawn {
namespace {

using Clock = std::chrono::steady_clock;

// How many nonces the replay check remembers (a group of N ranks uses at most N - 1 per rank).
constexpr size_t kNoncesKept = 4096;

struct GuardState {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::optional<RecordAuth> auth;                  // set once, by the first install()
  std::string who;                                 // "rank 1/4"
  std::unordered_map<int, std::string> listeners;  // fd → endpoint it was bound to (gloo's listeners)
  std::set<std::string> destinations;              // endpoints gloo connected to from a setup scope
  std::set<std::string> nonces;                    // tokens admitted so far (replays refused)
  std::deque<std::string> nonce_order;             // oldest first, to forget beyond kNoncesKept
  std::set<std::string> unused_stand_ins;          // endpoints of stand-ins not needed after all
  std::atomic<uint64_t> refused{0}, sent{0}, admitted{0}, stand_ins{0};
};

// Never destroyed: gloo's threads may still call accept()/connect() while the process exits.
GuardState& state() {
  static GuardState* s = new GuardState;
  return *s;
}

thread_local int t_scope = 0;

int raw_connect(int fd, const sockaddr* addr, socklen_t len) {
  return static_cast<int>(::syscall(SYS_connect, fd, addr, len));
}

int raw_accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return static_cast<int>(::syscall(SYS_accept4, fd, addr, len, flags));
}

// An IP endpoint as text ("127.0.0.1:40123", "[::1]:40123"; IPv4-mapped IPv6 addresses in their
// IPv4 form), which is also how endpoints are compared; "" when `sa` is no IP endpoint.
std::string endpoint_of(const sockaddr* sa, socklen_t len) {
  if (sa == nullptr) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    sockaddr_in in;
    std::memcpy(&in, sa, sizeof in);
    ::inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(in.sin_port));
  }
  if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    sockaddr_in6 in6;
    std::memcpy(&in6, sa, sizeof in6);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      ::inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], buf, sizeof buf);
      return std::string(buf) + ":" + std::to_string(ntohs(in6.sin6_port));
    }
    ::inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6.sin6_port));
  }
  return "";
}

std::string local_endpoint(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return endpoint_of(reinterpret_cast<sockaddr*>(&ss), len);
}

bool is_stream(int fd) {
  int type = 0;
  socklen_t len = sizeof type;
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left);
}

// poll() for `events` on `fd` until `deadline`, EINTR retried: the revents, 0 on timeout.
short wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return p.revents;
    if (n == 0) return 0;
    if (errno != EINTR) return POLLERR;
  }
}

std::string hex_bytes(const uint8_t* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n && i < 8; ++i) {
    if (i) out += ' ';
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

}  // namespace

std::chrono::milliseconds gloo_token_wait(int fd) {
  return std::clamp(2 * sys::tcp_retransmission_estimate(fd), kGlooTokenWait, std::chrono::milliseconds(60000));
}

namespace {

// Reads the connection token from accepted socket `c`. "" when it is valid (and not a replay),
// else why it is refused.
std::string read_token(GuardState& s, int c) {
  RecordAuth::Token t{};
  size_t got = 0;
  const std::chrono::milliseconds wait = gloo_token_wait(c);
  const auto deadline = Clock::now() + wait;
  while (got < t.size()) {
    const ssize_t n = ::recv(c, t.data() + got, t.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      const size_t magic = std::min<size_t>(got, 4);
      if (std::memcmp(t.data(), RecordAuth::kTokenMagic, magic) != 0) {
        return "not an lspawn connection token (first bytes " + hex_bytes(t.data(), got) + ")";
      }
      continue;
    }
    if (n == 0) {
      return got == 0 ? "it closed without sending anything"
                      : "it closed after " + std::to_string(got) + " bytes of a connection token";
    }
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return "it reset the connection";
    if (errno != EAGAIN && errno != EWOULDBLOCK) return std::string("recv: ") + std::strerror(errno);
    if (wait_for(c, POLLIN, deadline) == 0) {
      return got == 0 ? "it sent nothing for " + seconds_text(wait)
                      : "it sent " + std::to_string(got) + " bytes of a connection token and nothing more for " +
                            seconds_text(wait);
    }
  }
  if (!s.auth->check_connection_token(t)) return "a connection token not signed with this job's secret";
  const std::string nonce(reinterpret_cast<const char*>(t.data()) + 4, RecordAuth::kNonceSize);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.nonces.insert(nonce).second) return "a connection token used before (a replay)";
  s.nonce_order.push_back(nonce);
  if (s.nonce_order.size() > kNoncesKept) {
    s.nonces.erase(s.nonce_order.front());
    s.nonce_order.pop_front();
  }
  return "";
}

void report_refusal(GuardState& s, const std::string& listener, const std::string& peer, const std::string& why) {
  const uint64_t n = s.refused.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n > static_cast<uint64_t>(kGlooRefusalsPrinted)) return;
  std::string line = "[lspawn] " + s.who + ": gloo at " + listener + " refused a connection from " + peer + ": " + why +
                     "; the job goes on";
  if (n == static_cast<uint64_t>(kGlooRefusalsPrinted)) {
    line += " (further refusals on gloo's listeners are counted, not printed)";
  }
  line += "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// Whether an accepted connection from `peer` is a stand-in made for a pair that then got its real
// peer first (stand_in): closed without a word.
bool unused_stand_in(GuardState& s, const std::string& peer) {
  std::lock_guard<std::mutex> lock(s.mu);
  return s.unused_stand_ins.erase(peer) > 0;
}

// The listening endpoint of `fd` when it is one of gloo's listeners, else "".
std::string gloo_listener(GuardState& s, int fd) {
  std::string bound;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const auto it = s.listeners.find(fd);
    if (it == s.listeners.end()) return "";
    bound = it->second;
  }
  const std::string now = local_endpoint(fd);
  if (now == bound) return now;
  // The descriptor was closed and its number reused for another socket: forget it.
  std::lock_guard<std::mutex> lock(s.mu);
  s.listeners.erase(fd);
  return "";
}

// One connection accepted from `listening` and checked. kind None: accept() failed (errno set).
// Mine: the connection is from `mine` (a stand-in of ours), unchecked. Admitted: it carried a
// valid token (counted). Refused: it did not; named on stderr and closed. Dropped: a stand-in not
// needed after all, closed.
struct Checked {
  enum Kind { None, Mine, Admitted, Refused, Dropped } kind = None;
  int fd = -1;
  sockaddr_storage addr{};
  socklen_t len = sizeof(sockaddr_storage);
};

Checked accept_checked(GuardState& s, int listening, const std::string& listener, int flags,
                       const std::string& mine = "") {
  Checked c;
  c.fd = raw_accept4(listening, reinterpret_cast<sockaddr*>(&c.addr), &c.len, flags);
  if (c.fd < 0) return c;
  const std::string peer = endpoint_of(reinterpret_cast<sockaddr*>(&c.addr), c.len);
  if (!mine.empty() && peer == mine) {
    c.kind = Checked::Mine;
    return c;
  }
  std::string why;
  if (unused_stand_in(s, peer)) {
    c.kind = Checked::Dropped;
  } else if ((why = read_token(s, c.fd)).empty()) {
    s.admitted.fetch_add(1, std::memory_order_relaxed);
    c.kind = Checked::Admitted;
    return c;
  } else {
    report_refusal(s, listener, peer, why);
    c.kind = Checked::Refused;
  }
  ::close(c.fd);
  c.fd = -1;
  return c;
}

// accept()'s result for the caller: the peer's address in `addr`/`len` (when given), the fd.
int give(const Checked& c, sockaddr* addr, socklen_t* len) {
  if (addr != nullptr && len != nullptr) {
    std::memcpy(addr, &c.addr, std::min<size_t>(*len, c.len));
    *len = c.len;
  }
  return c.fd;
}

// Copies what `from` has to `to` (at most one read). False at EOF or error.
bool pump(int from, int to, std::vector<char>& buf) {
  const ssize_t n = ::recv(from, buf.data(), buf.size(), MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  for (ssize_t off = 0; off < n;) {
    const ssize_t w = ::send(to, buf.data() + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += w;
  }
  return true;
}

// 1.13's pair, after the guard refused a stranger on its listener (`listening`: lspawn's own
// descriptor of it; gloo closes its one) and gave gloo a stand-in whose other end is `ours`:
// waits for the real peer on the listener (refusing further strangers) and relays between it and
// `ours` until either side closes. Gives up when gloo closes the stand-in first (this side of the
// pair was the one to connect out, and has).
void relay_pair(GuardState& s, int listening, int ours, std::string listener) {
  std::vector<char> buf(256 * 1024);
  int peer = -1;
  while (peer < 0) {
    pollfd p[2] = {{listening, POLLIN, 0}, {ours, POLLRDHUP, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) break;  // gloo gave the pair up
    if ((p[0].revents & POLLIN) == 0) continue;
    const Checked c = accept_checked(s, listening, listener, SOCK_CLOEXEC);
    if (c.kind == Checked::Admitted) {
      peer = c.fd;
      int one = 1;
      ::setsockopt(peer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  }
  ::close(listening);
  while (peer >= 0) {
    pollfd p[2] = {{peer, POLLIN, 0}, {ours, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) break;
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && !pump(peer, ours, buf)) break;
    if ((p[1].revents & (POLLIN | POLLHUP | POLLERR)) && !pump(ours, peer, buf)) break;
  }
  if (peer >= 0) ::close(peer);
  ::close(ours);
}

// 1.13, after a refusal on pair listener `fd`: a connection for gloo to take as the pair's, made
// to the listener itself, so that its local address is the listener's (gloo compares it with the
// peer's to decide which side connects out) — or the real peer's, if it is already waiting. A
// thread relays the stand-in to the real peer once it connects (relay_pair). -1 with errno set
// when none could be made.
int stand_in(GuardState& s, int fd, const std::string& listener, sockaddr* addr, socklen_t* len, int flags) {
  sockaddr_storage self{};
  socklen_t slen = sizeof self;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &slen) != 0) return -1;
  const int ours = ::socket(self.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (ours < 0) return -1;
  if (raw_connect(ours, reinterpret_cast<sockaddr*>(&self), slen) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(ours);
    errno = err;
    return -1;
  }
  const std::string mine = local_endpoint(ours);
  // The stand-in is queued behind whatever else is pending; with the queue full (1.13 listens
  // with a backlog of 1) its SYN is retried, after 1 s, 3 s, ...
  const auto deadline = Clock::now() + kGlooConnectWait;
  for (;;) {
    if (wait_for(fd, POLLIN, deadline) == 0) {
      ::close(ours);
      errno = ETIMEDOUT;
      return -1;
    }
    const Checked c = accept_checked(s, fd, listener, flags, mine);
    if (c.kind == Checked::Mine) {
      // gloo's pair gets the stand-in; lspawn keeps the listener and waits for the real peer.
      const int listening = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (listening < 0) {
        const int err = errno;
        ::close(c.fd);
        ::close(ours);
        errno = err;
        return -1;
      }
      ::fcntl(ours, F_SETFL, ::fcntl(ours, F_GETFL) & ~O_NONBLOCK);
      s.stand_ins.fetch_add(1, std::memory_order_relaxed);
      std::thread(relay_pair, std::ref(s), listening, ours, listener).detach();
      return give(c, addr, len);
    }
    if (c.kind == Checked::Admitted) {  // the real peer came first: no stand-in needed
      {
        std::lock_guard<std::mutex> lock(s.mu);
        s.unused_stand_ins.insert(mine);
      }
      ::close(ours);
      return give(c, addr, len);
    }
  }
}

// After connect() on `fd` to `addr`: when it is one of gloo's connections, wait until it is
// established and send the token. Leaves errno and SO_ERROR as connect() left them.
void send_token_if_gloo(GuardState& s, int fd, const sockaddr* addr, socklen_t len, bool connected) {
  const std::string dest = endpoint_of(addr, len);
  if (dest.empty()) return;
  if (t_scope == 0) {  // gloo's only if gloo connected there from a setup scope before
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.destinations.count(dest) == 0) return;
  }
  if (!is_stream(fd)) return;
  if (t_scope > 0) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.destinations.insert(dest);
  }
  if (!connected) {
    const short ev = wait_for(fd, POLLOUT, Clock::now() + kGlooConnectWait);
    // Refused, reset or still pending: gloo reads SO_ERROR (untouched here) and decides.
    if ((ev & POLLOUT) == 0 || (ev & (POLLERR | POLLHUP)) != 0) return;
    sockaddr_storage peer{};
    socklen_t plen = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) return;
  }
  const RecordAuth::Token t = s.auth->connection_token();
  const ssize_t n = ::send(fd, t.data(), t.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(t.size())) s.sent.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void GlooGuard::install(const RecordAuth& auth, const std::string& who) {
  GuardState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.auth) {
    if (!s.auth->same_secret(auth)) {
      throw std::logic_error("GlooGuard::install: already installed with another secret");
    }
    return;
  }
  s.auth = auth;
  s.who = who;
  // torch 2.x's lazy gloo init connects pairs at their first use, from whatever thread uses them,
  // outside any setup scope: such connections would carry no token and be refused.
  if (const char* lazy = std::getenv("TORCH_GLOO_LAZY_INIT"); lazy != nullptr && std::strcmp(lazy, "0") != 0 && *lazy) {
    std::fprintf(stderr,
                 "[lspawn] %s: warning: gloo's connections are not authenticated: TORCH_GLOO_LAZY_INIT=%s "
                 "connects gloo's pairs outside lspawn's setup (unset it to authenticate them)\n",
                 who.c_str(), lazy);
    return;
  }
  if (!detail::socket_calls_interposed()) {
    std::fprintf(stderr,
                 "[lspawn] %s: warning: gloo's connections are not authenticated: this program does not "
                 "export lspawn_runtime's accept()/connect() (link it with ENABLE_EXPORTS / -rdynamic)\n",
                 who.c_str());
    return;
  }
  s.on.store(true, std::memory_order_release);
}

void GlooGuard::install_from_environment(const std::string& who) {
  if (auto auth = RecordAuth::from_environment()) install(*auth, who);
}

bool GlooGuard::active() { return state().on.load(std::memory_order_acquire); }
uint64_t GlooGuard::refused() { return state().refused.load(std::memory_order_relaxed); }
uint64_t GlooGuard::sent() { return state().sent.load(std::memory_order_relaxed); }
uint64_t GlooGuard::admitted() { return state().admitted.load(std::memory_order_relaxed); }
uint64_t GlooGuard::stand_ins() { return state().stand_ins.load(std::memory_order_relaxed); }

GlooSetupScope::GlooSetupScope() { ++t_scope; }
GlooSetupScope::~GlooSetupScope() { --t_scope; }

namespace detail {

void gloo_guard_note_bind(int fd) noexcept {
  if (t_scope == 0) return;
  GuardState& s = state();
  if (!s.on.load(std::memory_order_acquire) || !is_stream(fd)) return;
  try {
    const std::string bound = local_endpoint(fd);
    if (bound.empty()) return;
    std::lock_guard<std::mutex> lock(s.mu);
    s.listeners[fd] = bound;
  } catch (...) {
    // Out of memory: this listener goes unguarded, as without a secret.
  }
}

int gloo_guard_accept(int fd, sockaddr* addr, socklen_t* len, int flags) {
  GuardState& s = state();
  if (!s.on.load(std::memory_order_acquire)) return raw_accept4(fd, addr, len, flags);
  const std::string listener = gloo_listener(s, fd);
  if (listener.empty()) return raw_accept4(fd, addr, len, flags);
  for (;;) {
    const Checked c = accept_checked(s, fd, listener, flags);
    if (c.kind == Checked::None) return -1;  // 2.x, after a refusal: EAGAIN, gloo tries next tick
    if (c.kind == Checked::Admitted) return give(c, addr, len);
    if (c.kind == Checked::Refused && compat::kGlooListenerPerPair) {
      // 1.13: the pair takes whatever accept() returns as its peer and closes its listener; its
      // real peer may come later, or never (when this side is the one to connect out).
      return stand_in(s, fd, listener, addr, len, flags);
    }
    // 2.x: the next pending connection, or EAGAIN (its listener is non-blocking).
  }
}

void gloo_guard_after_connect(int fd, const sockaddr* addr, socklen_t len, int rc) noexcept {
  GuardState& s = state();
  if (!s.on.load(std::memory_order_acquire) || addr == nullptr ||
      (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) {
    return;
  }
  if (rc != 0 && errno != EINPROGRESS) return;
  try {
    send_token_if_gloo(s, fd, addr, len, rc == 0);
  } catch (...) {
    // No token (out of memory, no randomness): the peer refuses the connection and says so.
  }
}

}  // namespace detail
}  // namespace lspawn
