#include "runtime/store_gate.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <optional>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sys/sys.hpp"
#include "runtime/store_listener.hpp"

namespace lspawn {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;  // c10d::detail::validationMagicNumber
constexpr std::uint8_t kLegacyLastQuery = 9;            // SET … DELETE_KEY, APPEND (1.13)
constexpr std::uint8_t kLegacyGetNumKeys = 6;           // the one query with no argument
constexpr std::size_t kHeadBytes = 9;                   // the longest header checked
constexpr std::size_t kChunk = 64 * 1024;

std::string hex_bytes(const std::uint8_t* p, std::size_t n) {
  std::string s;
  char b[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, i ? " %02x" : "%02x", p[i]);
    s += b;
  }
  return s;
}

std::string byte_count(std::size_t n) { return n == 1 ? "1 byte" : std::to_string(n) + " bytes"; }

std::uint64_t little_endian(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// One client: first its head is read and checked (Head), then the store server is connected
// (Connecting: a non-blocking connect, so that a full accept queue on the server stalls this
// client only), then bytes are relayed both ways (Relaying). `out[0]` is pending client → store,
// `out[1]` store → client.
enum class Phase { Head, Connecting, Relaying };

struct Conn {
  sys::Fd client;
  sys::Fd store;
  std::string peer;
  std::vector<std::uint8_t> head;
  Clock::time_point first_byte{};     // Head: when its first byte came (the half-sent deadline)
  Clock::time_point connect_start{};  // Connecting: when the connect began
  std::string out[2];
  Phase phase = Phase::Head;
  bool closed = false;                              // done with: removed after the current batch of events
  std::uint32_t client_mask = 0, store_mask = 0;    // what epoll watches on each fd now
  std::list<Conn>::iterator self;                   // its place in Loop::conns
  std::optional<std::list<Conn*>::iterator> timed;  // its place in Loop::heads or Loop::connecting
};

// epoll's user data: the wake and listening fds are 0 and 1; a connection's fd is its Conn's
// address, plus 1 for its store side (a Conn is aligned to more than 2).
constexpr std::uint64_t kWakeTag = 0, kListenTag = 1;
std::uint64_t tag(const Conn& c, bool store_side) {
  return reinterpret_cast<std::uintptr_t>(&c) | static_cast<std::uintptr_t>(store_side);
}

}  // namespace

HeadVerdict check_store_head(StoreProtocol protocol, const std::uint8_t* head, std::size_t n) {
  if (n == 0) return HeadVerdict::NeedMore;
  if (protocol == StoreProtocol::Validated) {
    std::uint8_t want[5] = {0};  // QueryType::VALIDATE, then the magic (little-endian)
    for (int i = 0; i < 4; ++i) want[1 + i] = static_cast<std::uint8_t>(kValidationMagic >> (8 * i));
    const std::size_t m = std::min<std::size_t>(n, sizeof want);
    if (std::memcmp(head, want, m) != 0) return HeadVerdict::Refuse;
    return m == sizeof want ? HeadVerdict::Accept : HeadVerdict::NeedMore;
  }
  if (head[0] > kLegacyLastQuery) return HeadVerdict::Refuse;
  if (head[0] == kLegacyGetNumKeys) return HeadVerdict::Accept;
  if (n < kHeadBytes) return HeadVerdict::NeedMore;
  return little_endian(head + 1, 8) <= kMaxFirstLength ? HeadVerdict::Accept : HeadVerdict::Refuse;
}

struct StoreGate::Loop {
  sys::Fd listen;
  sys::Fd wake;  // eventfd: the destructor's "stop"
  sys::Fd epoll;
  std::uint16_t store_port;
  sockaddr_in store_addr{};  // 127.0.0.1:store_port
  StoreProtocol protocol;
  std::string where;
  std::function<void(const std::string&)> log;
  std::list<Conn> conns;
  // Connections with a deadline, oldest first: both deadlines are a fixed time after the event
  // that puts a connection here, so appending keeps each list in deadline order.
  std::list<Conn*> heads;       // Head with part of a header: first_byte + head_timeout
  std::list<Conn*> connecting;  // Connecting: connect_start + kStoreConnectTimeout
  std::vector<Conn*> closing;   // closed during the current batch of events
  // accept() failed (EMFILE and the like): the listening socket is left out of the wait until
  // then, rather than waking the loop at once, again and again.
  std::optional<Clock::time_point> listen_paused_until;
  std::chrono::milliseconds head_timeout{kStoreReceiveTimeout};
  std::atomic<int> refused{0};
  std::thread thread;

  static constexpr std::chrono::milliseconds kStoreConnectTimeout{5000};
  static constexpr std::chrono::milliseconds kAcceptPause{100};

  void say(const std::string& line) {
    if (log) {
      log(line);
    } else {
      std::fprintf(stderr, "[lspawn] %s\n", line.c_str());
    }
  }

  void refuse(Conn& c, const std::string& why) {
    refused.fetch_add(1, std::memory_order_relaxed);
    say("store at " + where + ": refused a connection from " + c.peer + ": " + why);
  }

  // epoll_ctl(op) of `fd` for `events`, tagged `data`.
  void watch(int op, int fd, std::uint32_t events, std::uint64_t data) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    if (::epoll_ctl(epoll.get(), op, fd, &ev) != 0) sys::throw_errno("epoll_ctl", "store gate " + where);
  }

  // Brings what epoll watches on `c`'s fds in line with its phase and pending bytes.
  void rearm(Conn& c) {
    std::uint32_t client = 0, store = 0;
    switch (c.phase) {
      case Phase::Head: client = EPOLLIN; break;
      case Phase::Connecting: store = EPOLLOUT; break;
      case Phase::Relaying:
        // Each direction: read its source while nothing is pending, else wait to write.
        if (c.out[0].empty())
          client |= EPOLLIN;
        else
          store |= EPOLLOUT;
        if (c.out[1].empty())
          store |= EPOLLIN;
        else
          client |= EPOLLOUT;
        break;
    }
    if (client != c.client_mask) {
      watch(EPOLL_CTL_MOD, c.client.get(), client, tag(c, false));
      c.client_mask = client;
    }
    if (c.store && store != c.store_mask) {
      watch(EPOLL_CTL_MOD, c.store.get(), store, tag(c, true));
      c.store_mask = store;
    }
  }

  void close_conn(Conn& c) {
    if (c.closed) return;
    c.closed = true;
    closing.push_back(&c);
  }

  void untime(Conn& c, std::list<Conn*>& list) {
    if (c.timed) list.erase(*c.timed);
    c.timed.reset();
  }

  // Reads what the client sent so far into its head; false when the connection is done with.
  bool read_head(Conn& c) {
    std::uint8_t buf[kHeadBytes];
    const std::size_t want = kHeadBytes - c.head.size();
    const ssize_t r = sys::read_some(c.client.get(), reinterpret_cast<char*>(buf), want, "store gate");
    if (r < 0) return true;
    if (r == 0) {
      // Closed: silently when it never spoke (a probe, 1.13's unused callback connection).
      if (!c.head.empty()) {
        refuse(c, "closed after " + byte_count(c.head.size()) + " of a request (" +
                      hex_bytes(c.head.data(), c.head.size()) + ")");
      }
      return false;
    }
    if (c.head.empty()) {
      c.first_byte = Clock::now();
      c.timed = heads.insert(heads.end(), &c);
    }
    c.head.insert(c.head.end(), buf, buf + r);
    switch (check_store_head(protocol, c.head.data(), c.head.size())) {
      case HeadVerdict::NeedMore:
        if (c.head.size() < kHeadBytes) return true;
        [[fallthrough]];
      case HeadVerdict::Refuse:
        refuse(c, "not a c10d store request (first bytes " + hex_bytes(c.head.data(), c.head.size()) + ")");
        return false;
      case HeadVerdict::Accept: break;
    }
    untime(c, heads);
    return start_connect(c);
  }

  // The head is a store request: connect to the server (non-blocking) and hold the head as the
  // first bytes for it. False when the connect failed at once.
  bool start_connect(Conn& c) {
    const int one = 1;  // requests are small writes: no Nagle delay on the extra hop
    ::setsockopt(c.client.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c.out[0].assign(c.head.begin(), c.head.end());
    c.store = sys::Fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!c.store) return cannot_reach(c, errno);
    ::setsockopt(c.store.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc;
    do {
      rc = ::connect(c.store.get(), reinterpret_cast<const sockaddr*>(&store_addr), sizeof store_addr);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EINPROGRESS) return cannot_reach(c, errno);
    watch(EPOLL_CTL_ADD, c.store.get(), 0, tag(c, true));
    c.store_mask = 0;
    if (rc == 0) {
      c.phase = Phase::Relaying;
    } else {
      c.phase = Phase::Connecting;
      c.connect_start = Clock::now();
      c.timed = connecting.insert(connecting.end(), &c);
    }
    return true;
  }

  bool cannot_reach(Conn& c, int err) {
    say("store at " + where + ": cannot reach the store server on 127.0.0.1:" + std::to_string(store_port) + " for " +
        c.peer + ": " + std::strerror(err));
    return false;
  }

  // Connecting and the store's fd is writable: connected, or failed (SO_ERROR).
  bool finish_connect(Conn& c) {
    int so = 0;
    socklen_t len = sizeof so;
    ::getsockopt(c.store.get(), SOL_SOCKET, SO_ERROR, &so, &len);
    untime(c, connecting);
    if (so != 0) return cannot_reach(c, so);
    c.phase = Phase::Relaying;
    return true;
  }

  // Moves bytes from `from` into `pending` (when it is empty) and from `pending` to `to`; false
  // when either end closed.
  static bool pump(int from, int to, std::string& pending, bool readable, bool writable) {
    if (readable && pending.empty()) {
      char buf[kChunk];
      const ssize_t r = sys::read_some(from, buf, sizeof buf, "store gate");
      if (r == 0) return false;
      if (r > 0) pending.assign(buf, static_cast<std::size_t>(r));
    }
    if (!pending.empty() && (writable || readable)) {
      const ssize_t w = sys::send_some(to, pending.data(), pending.size(), "store gate");
      if (w > 0) pending.erase(0, static_cast<std::size_t>(w));
    }
    return true;
  }

  // One event on one of `c`'s fds; false when the connection is done with.
  bool on_event(Conn& c, bool store_side, std::uint32_t revents) {
    switch (c.phase) {
      case Phase::Head: return read_head(c);
      case Phase::Connecting:
        // The client's fd is watched for nothing now, but epoll reports a reset or hang-up anyway
        // (level-triggered: again on every wait until the connection is closed).
        return store_side ? finish_connect(c) : !(revents & (EPOLLERR | EPOLLHUP));
      case Phase::Relaying: break;
    }
    if (revents & EPOLLERR) return false;  // reset: reported on every wait, whatever is watched
    const bool in = revents & (EPOLLIN | EPOLLHUP | EPOLLERR);
    const bool out = revents & EPOLLOUT;
    if (!store_side) {
      return pump(c.client.get(), c.store.get(), c.out[0], in, false) &&
             pump(c.store.get(), c.client.get(), c.out[1], false, out);
    }
    return pump(c.store.get(), c.client.get(), c.out[1], in, false) &&
           pump(c.client.get(), c.store.get(), c.out[0], false, out);
  }

  // Connections past their deadline (half-sent heads, connects to the server), oldest first; the
  // time until the next deadline (-1: none).
  int expire(Clock::time_point now) {
    while (!heads.empty() && now - heads.front()->first_byte >= head_timeout) {
      Conn& c = *heads.front();
      untime(c, heads);
      refuse(c, "sent " + byte_count(c.head.size()) + " of a request (" + hex_bytes(c.head.data(), c.head.size()) +
                    "), then nothing for " + std::to_string(head_timeout.count()) + " ms");
      close_conn(c);
    }
    while (!connecting.empty() && now - connecting.front()->connect_start >= kStoreConnectTimeout) {
      Conn& c = *connecting.front();
      untime(c, connecting);
      cannot_reach(c, ETIMEDOUT);
      close_conn(c);
    }
    std::optional<Clock::time_point> next;
    auto earliest = [&](Clock::time_point t) { next = std::min(next.value_or(t), t); };
    if (!heads.empty()) earliest(heads.front()->first_byte + head_timeout);
    if (!connecting.empty()) earliest(connecting.front()->connect_start + kStoreConnectTimeout);
    if (listen_paused_until) earliest(*listen_paused_until);
    if (!next) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
    return static_cast<int>(std::max<long long>(0, left));
  }

  void remove_closed() {
    for (Conn* c : closing) {
      untime(*c, c->phase == Phase::Head ? heads : connecting);
      conns.erase(c->self);  // closing its fds takes them out of the epoll set
    }
    closing.clear();
  }

  void run() {
    watch(EPOLL_CTL_ADD, wake.get(), EPOLLIN, kWakeTag);
    watch(EPOLL_CTL_ADD, listen.get(), EPOLLIN, kListenTag);
    std::vector<epoll_event> events(256);
    for (;;) {
      const auto now = Clock::now();
      if (listen_paused_until && now >= *listen_paused_until) {
        listen_paused_until.reset();
        watch(EPOLL_CTL_MOD, listen.get(), EPOLLIN, kListenTag);
      }
      const int timeout_ms = expire(now);
      remove_closed();
      const int n = ::epoll_wait(epoll.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        say("store at " + where + ": epoll_wait failed: " + std::strerror(errno) + "; the gate stops");
        return;
      }
      for (int i = 0; i < n; ++i) {
        const std::uint64_t t = events[i].data.u64;
        if (t == kWakeTag) {
          stop();
          return;
        }
        if (t == kListenTag) {
          accept_all();
          continue;
        }
        Conn& c = *reinterpret_cast<Conn*>(t & ~std::uint64_t{1});
        if (c.closed) continue;  // an earlier event of this batch ended it
        bool alive = true;
        try {
          alive = on_event(c, t & 1, events[i].events);
          if (alive) rearm(c);
        } catch (const std::exception&) {
          alive = false;  // reset by either end: the connection ends, as a direct one would
        }
        if (!alive) close_conn(c);
      }
      remove_closed();
    }
  }

  // The store is going away. Connections still in the listen backlog are accepted so that the
  // destructor closes them (FIN) rather than the kernel resetting them with the listening socket
  // (a reset kills LibTorch 1.13's callback-client thread: it throws from its loop). A head still
  // incomplete after reading what has arrived is reported rather than lost.
  void stop() {
    accept_all();
    for (auto& c : conns) {
      if (c.phase != Phase::Head || c.closed) continue;
      std::uint8_t buf[kHeadBytes];
      ssize_t r = 1;
      while (r > 0 && c.head.size() < kHeadBytes) {
        try {
          r = sys::read_some(c.client.get(), reinterpret_cast<char*>(buf), kHeadBytes - c.head.size(), "store gate");
        } catch (const sys::SysError&) {
          r = -1;
        }
        if (r > 0) c.head.insert(c.head.end(), buf, buf + r);
      }
      if (c.head.empty()) continue;
      const HeadVerdict v = check_store_head(protocol, c.head.data(), c.head.size());
      if (v == HeadVerdict::Accept) continue;  // a request in flight as the store closed
      const std::string bytes = hex_bytes(c.head.data(), c.head.size());
      refuse(c, v == HeadVerdict::Refuse ? "not a c10d store request (first bytes " + bytes + ")"
                                         : "sent " + byte_count(c.head.size()) + " of a request (" + bytes +
                                               "), then nothing until the store closed");
    }
  }

  void accept_all() {
    for (;;) {
      sys::Fd fd;
      std::string peer;
      try {
        fd = sys::tcp_accept(listen.get(), "store gate " + where, &peer);
      } catch (const sys::SysError& e) {
        // EMFILE and the like: said once per pause; the clients wait in the backlog meanwhile.
        say("store at " + where + ": " + e.what() + "; accepting again in " + std::to_string(kAcceptPause.count()) +
            " ms");
        if (!listen_paused_until) watch(EPOLL_CTL_MOD, listen.get(), 0, kListenTag);
        listen_paused_until = Clock::now() + kAcceptPause;
        return;
      }
      if (!fd) return;
      Conn& c = conns.emplace_back();
      c.self = std::prev(conns.end());
      c.peer = std::move(peer);
      c.client = std::move(fd);
      c.client_mask = EPOLLIN;
      try {
        watch(EPOLL_CTL_ADD, c.client.get(), EPOLLIN, tag(c, false));
      } catch (const sys::SysError& e) {
        say("store at " + where + ": " + e.what() + " (" + c.peer + " dropped)");
        conns.pop_back();
      }
    }
  }
};

StoreGate::StoreGate(int listen_fd, std::uint16_t store_port, StoreProtocol protocol, std::string where,
                     std::function<void(const std::string&)> log, std::chrono::milliseconds head_timeout)
    : loop_(std::make_unique<Loop>()) {
  loop_->head_timeout = head_timeout;
  loop_->listen = sys::Fd(listen_fd);
  port_ = static_cast<std::uint16_t>(sys::local_port(listen_fd));
  sys::set_nonblocking(listen_fd, "store gate " + where);
  const int w = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w < 0) sys::throw_errno("eventfd", "store gate " + where);
  loop_->wake = sys::Fd(w);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) sys::throw_errno("epoll_create1", "store gate " + where);
  loop_->epoll = sys::Fd(ep);
  loop_->store_port = store_port;
  loop_->store_addr.sin_family = AF_INET;
  loop_->store_addr.sin_port = htons(store_port);
  loop_->store_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  loop_->protocol = protocol;
  loop_->where = std::move(where);
  loop_->log = std::move(log);
  loop_->thread = std::thread([l = loop_.get()] {
    try {
      l->run();
    } catch (const std::exception& e) {  // accept() out of memory and the like: say so, stop
      l->say("store at " + l->where + ": the gate stops (no new clients reach the store): " + e.what());
    }
  });
}

StoreGate::~StoreGate() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(loop_->wake.get(), &one, sizeof one);
  loop_->thread.join();
}

int StoreGate::refused() const { return loop_->refused.load(std::memory_order_relaxed); }

}  // namespace lspawn
