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
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "supervisor/sys.hpp"
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

// One client: first its head is read and checked, then bytes are relayed both ways. `out[0]` is
// pending client → store, `out[1]` store → client.
struct Conn {
  sys::Fd client;
  sys::Fd store;
  std::string peer;
  std::vector<std::uint8_t> head;
  Clock::time_point first_byte{};
  std::string out[2];
  bool relaying = false;
};

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
  std::uint16_t store_port;
  StoreProtocol protocol;
  std::string where;
  std::function<void(const std::string&)> log;
  std::list<Conn> conns;
  std::atomic<int> refused{0};
  std::thread thread;

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
    if (c.head.empty()) c.first_byte = Clock::now();
    c.head.insert(c.head.end(), buf, buf + r);
    switch (check_store_head(protocol, c.head.data(), c.head.size())) {
      case HeadVerdict::NeedMore:
        if (c.head.size() < kHeadBytes) return true;
        [[fallthrough]];
      case HeadVerdict::Refuse:
        refuse(c, "not a c10d store request (first bytes " + hex_bytes(c.head.data(), c.head.size()) + ")");
        return false;
      case HeadVerdict::Accept:
        break;
    }
    int err = 0;
    c.store = sys::tcp_connect("127.0.0.1", store_port, std::chrono::seconds(5), &err);
    if (!c.store) {
      say("store at " + where + ": cannot reach the store server on 127.0.0.1:" + std::to_string(store_port) +
          " for " + c.peer + ": " + std::strerror(err));
      return false;
    }
    const int one = 1;  // requests are small writes: no Nagle delay on the extra hop
    ::setsockopt(c.client.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(c.store.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c.out[0].assign(c.head.begin(), c.head.end());
    c.relaying = true;
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

  void run() {
    std::vector<pollfd> fds;
    std::vector<Conn*> owner;  // fds[i] belongs to owner[i] (null: wake / listen)
    for (;;) {
      fds.clear();
      owner.clear();
      fds.push_back({wake.get(), POLLIN, 0});
      fds.push_back({listen.get(), POLLIN, 0});
      owner.assign(2, nullptr);
      std::optional<Clock::time_point> next;  // the earliest half-sent head's deadline
      for (auto& c : conns) {
        if (!c.relaying) {
          fds.push_back({c.client.get(), POLLIN, 0});
          owner.push_back(&c);
          if (!c.head.empty()) next = std::min(next.value_or(Clock::time_point::max()), c.first_byte + kStoreReceiveTimeout);
          continue;
        }
        // Each direction: read its source while nothing is pending, else wait to write.
        short client_ev = 0, store_ev = 0;
        if (c.out[0].empty()) client_ev |= POLLIN; else store_ev |= POLLOUT;
        if (c.out[1].empty()) store_ev |= POLLIN; else client_ev |= POLLOUT;
        fds.push_back({c.client.get(), client_ev, 0});
        owner.push_back(&c);
        fds.push_back({c.store.get(), store_ev, 0});
        owner.push_back(&c);
      }
      int timeout_ms = -1;
      if (next) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
        timeout_ms = static_cast<int>(std::max<long long>(0, left));
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        say("store at " + where + ": poll failed: " + std::strerror(errno) + "; the gate stops");
        return;
      }
      if (fds[0].revents) {
        stop();
        return;
      }
      if (fds[1].revents & POLLIN) accept_all();
      std::vector<Conn*> done;
      for (std::size_t i = 2; i < fds.size(); ++i) {
        Conn& c = *owner[i];
        if (!fds[i].revents || std::find(done.begin(), done.end(), &c) != done.end()) continue;
        bool alive = true;
        try {
          if (!c.relaying) {
            alive = read_head(c);
          } else {
            const bool is_client = fds[i].fd == c.client.get();
            const bool in = fds[i].revents & (POLLIN | POLLHUP | POLLERR);
            const bool out = fds[i].revents & POLLOUT;
            if (is_client) {
              alive = pump(c.client.get(), c.store.get(), c.out[0], in, false) &&
                      pump(c.store.get(), c.client.get(), c.out[1], false, out);
            } else {
              alive = pump(c.store.get(), c.client.get(), c.out[1], in, false) &&
                      pump(c.client.get(), c.store.get(), c.out[0], false, out);
            }
          }
        } catch (const std::exception&) {
          alive = false;  // reset by either end: the connection ends, as a direct one would
        }
        if (!alive) done.push_back(&c);
      }
      // Half-sent heads past their time.
      const auto later = Clock::now();
      for (auto& c : conns) {
        if (!c.relaying && !c.head.empty() && later - c.first_byte >= kStoreReceiveTimeout &&
            std::find(done.begin(), done.end(), &c) == done.end()) {
          refuse(c, "sent " + byte_count(c.head.size()) + " of a request (" +
                        hex_bytes(c.head.data(), c.head.size()) + "), then nothing for " +
                        std::to_string(kStoreReceiveTimeout.count()) + " ms");
          done.push_back(&c);
        }
      }
      conns.remove_if([&](const Conn& c) { return std::find(done.begin(), done.end(), &c) != done.end(); });
    }
  }

  // The store is going away. Connections still in the listen backlog are accepted so that the
  // destructor closes them (FIN) rather than the kernel resetting them with the listening socket
  // (a reset kills LibTorch 1.13's callback-client thread: it throws from its loop). A head still
  // incomplete after reading what has arrived is reported rather than lost.
  void stop() {
    accept_all();
    for (auto& c : conns) {
      if (c.relaying) continue;
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
      refuse(c, v == HeadVerdict::Refuse
                    ? "not a c10d store request (first bytes " + bytes + ")"
                    : "sent " + byte_count(c.head.size()) + " of a request (" + bytes + "), then nothing until the store closed");
    }
  }

  void accept_all() {
    for (;;) {
      sys::Fd fd;
      std::string peer;
      try {
        fd = sys::tcp_accept(listen.get(), "store gate " + where, &peer);
      } catch (const sys::SysError& e) {
        say("store at " + where + ": " + e.what());  // EMFILE and the like: try again later
        return;
      }
      if (!fd) return;
      Conn c;
      c.peer = std::move(peer);
      c.client = std::move(fd);
      conns.push_back(std::move(c));
    }
  }
};

StoreGate::StoreGate(int listen_fd, std::uint16_t store_port, StoreProtocol protocol, std::string where,
                     std::function<void(const std::string&)> log)
    : loop_(std::make_unique<Loop>()) {
  loop_->listen = sys::Fd(listen_fd);
  port_ = static_cast<std::uint16_t>(sys::local_port(listen_fd));
  sys::set_nonblocking(listen_fd, "store gate " + where);
  const int w = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w < 0) sys::throw_errno("eventfd", "store gate " + where);
  loop_->wake = sys::Fd(w);
  loop_->store_port = store_port;
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
