#include "runtime/rendezvous.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "sys/duration_text.hpp"
#include "sys/sys.hpp"
#include "runtime/authenticated_store.hpp"
#include "runtime/store_listener.hpp"
#include "runtime/torch_compat.hpp"

namespace lspawn {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Rank 0 (the arbiter) writes the outcome; every other rank waits for it. After a timeout the
// arbiter waits this long at most for the joined ranks to read the outcome before it throws
// (and its store server goes away).
constexpr milliseconds kOutcomeGrace{2000};

// TCPStore (1.13) converts its connect timeout to std::chrono::seconds, truncating.
constexpr milliseconds kMinConnectTimeout{2000};

std::string endpoint(const std::string& host, uint16_t port) { return host + ":" + std::to_string(port); }

milliseconds since(Clock::time_point t0) { return std::chrono::duration_cast<milliseconds>(Clock::now() - t0); }

// Rounded up: a wait given this does not end before the deadline for want of the last fraction
// of a millisecond.
milliseconds remaining(Clock::time_point deadline) {
  return std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
}

// How early, by this process's clock, a store wait given remaining(deadline) may still end: the
// kernel counts a socket's timeout in timer ticks (up to 10 ms), and TCPStore reports it as a
// failure ("Socket Timeout"). A failure this close to the deadline is the deadline.
constexpr milliseconds kTimerSlack{50};

std::string rank_list(const std::vector<int>& ranks) {
  constexpr size_t kShown = 32;
  std::string s = "[";
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  if (ranks.size() > kShown) s += ", ... " + std::to_string(ranks.size() - kShown) + " more";
  return s + "]";
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string rank_key(int r) { return "rdzv/rank/" + std::to_string(r); }
std::string read_key(int r) { return "rdzv/read/" + std::to_string(r); }
const std::string kOutcomeKey = "rdzv/outcome";

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// One non-blocking connect attempt to any address of host:port, waiting at most `wait` for it
// to complete. Returns "" when a connection was established (and closed again), else why not;
// `timed_out` is set when an attempt got no answer within `wait` (rather than a refusal).
std::string probe_listener(const std::string& host, uint16_t port, milliseconds wait, bool& timed_out) {
  timed_out = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) return std::string("getaddrinfo: ") + ::gai_strerror(gai);
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n;
        do {
          n = ::poll(&p, 1, static_cast<int>(wait.count()));
        } while (n < 0 && errno == EINTR);
        if (n == 0) {
          err = ETIMEDOUT;
          timed_out = true;
        } else {
          socklen_t len = sizeof err;
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      ::freeaddrinfo(res);
      return "";
    }
    why = std::string("connect: ") + std::strerror(err);
  }
  ::freeaddrinfo(res);
  return why;
}

PeerInfo parse_peer(int rank, const std::string& value, const std::string& where) {
  // "<host>\n<pid>"
  const auto nl = value.find('\n');
  PeerInfo p;
  p.rank = rank;
  if (nl == std::string::npos || value.size() > 1024) {
    throw RendezvousError("rendezvous at " + where + ": malformed record of rank " + std::to_string(rank) + " (" +
                          std::to_string(value.size()) + " bytes)");
  }
  p.host = value.substr(0, nl);
  p.pid = std::strtoll(value.c_str() + nl + 1, nullptr, 10);
  return p;
}

struct Outcome {
  bool ok = false;
  int joined = 0;
  std::vector<int> missing;
  std::vector<std::string> records;  // ok: every rank's announcement, by rank (or none)
};

// "ok" then, per rank, "\n<length> <record>"; or "timeout <joined> <missing...>".
std::string encode_outcome(const Outcome& o) {
  if (o.ok) {
    std::string s = "ok";
    for (const auto& r : o.records) s += "\n" + std::to_string(r.size()) + " " + r;
    return s;
  }
  std::string s = "timeout " + std::to_string(o.joined);
  for (int r : o.missing) s += " " + std::to_string(r);
  return s;
}

// Records of an "ok" outcome; empty when there are none or they do not parse (the caller then
// reads each rank's key).
std::vector<std::string> decode_records(const std::string& s, size_t n) {
  std::vector<std::string> out;
  size_t pos = 2;  // after "ok"
  while (pos < s.size() && out.size() < n) {
    if (s[pos] != '\n') return {};
    char* end = nullptr;
    const unsigned long len = std::strtoul(s.c_str() + pos + 1, &end, 10);
    const size_t at = static_cast<size_t>(end - s.c_str());
    if (end == s.c_str() + pos + 1 || at >= s.size() || s[at] != ' ' || len > 1024 || len > s.size() - at - 1) {
      return {};
    }
    out.push_back(s.substr(at + 1, len));
    pos = at + 1 + len;
  }
  if (out.size() != n || pos != s.size()) return {};
  return out;
}

Outcome decode_outcome(const std::string& s, size_t n) {
  Outcome o;
  if (s.compare(0, 2, "ok") == 0 && (s.size() == 2 || s[2] == '\n')) {
    o.ok = true;
    o.records = decode_records(s, n);
    return o;
  }
  const char* p = s.c_str();
  if (std::strncmp(p, "timeout ", 8) != 0) return o;
  char* end = nullptr;
  o.joined = static_cast<int>(std::strtol(p + 8, &end, 10));
  p = end;
  while (*p == ' ') {
    const long r = std::strtol(p + 1, &end, 10);
    if (end == p + 1) break;
    o.missing.push_back(static_cast<int>(r));
    p = end;
  }
  return o;
}

// Which ranks have not announced themselves yet (one check() per rank).
std::vector<int> find_missing(c10d::Store& store, int world_size) {
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (!store.check({rank_key(r)})) missing.push_back(r);
  }
  return missing;
}

}  // namespace

std::optional<std::vector<uint8_t>> try_get(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  return get_when_set(store, key);
}

std::vector<uint8_t> get_when_set(c10d::Store& store, const std::string& key) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + store.getTimeout();
  for (;;) {
    std::vector<uint8_t> v;
    try {
      v = store.get(key);
    } catch (const c10::Error& e) {  // TCPStore's timeout names no key
      throw std::runtime_error("waiting for store key '" + key + "': " + e.what_without_backtrace());
    }
    if (!v.empty() || store.check({key})) return v;
    // Woken without the key: someone's compareSet() found it missing. Wait again.
    if (Clock::now() >= deadline) {
      throw std::runtime_error("store key '" + key + "' not set within " + std::to_string(store.getTimeout().count()) +
                               " ms");
    }
  }
}

milliseconds resolve_rendezvous_timeout(milliseconds requested) {
  if (requested.count() > 0) return requested;
  if (auto env = duration_from_environment("LSPAWN_RDZV_TIMEOUT"); env && env->count() > 0) return *env;
  return kDefaultRendezvousTimeout;
}

namespace {

// The TCPStore server rank 0 runs, on 127.0.0.1 and a port of its own choosing: only the gate
// (and rank 0's own client) talk to it. 2.x: a loopback socket handed over; 1.13: its wildcard
// bind() steered to loopback.
c10d::TCPStoreOptions loopback_server_options(milliseconds timeout, std::optional<BindSteering>& steering, int& fd) {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;  // else the constructor blocks before the port can be published
  // TCPStore 1.13 truncates its connect timeout to whole seconds (0 s fails at once).
  o.timeout = std::max(timeout, kMinConnectTimeout);
  fd = listen_socket("127.0.0.1", 0);
  if (compat::set_listen_fd(o, fd)) {
    o.port = static_cast<uint16_t>(sys::local_port(fd));  // TCPStore checks the socket's port
  } else {
    ::close(fd);
    fd = -1;
    steering.emplace("127.0.0.1");
  }
  return o;
}

// The gate's public socket: bind_addr ("" → every interface, dual-stack where IPv6 exists).
int public_listen_socket(const std::string& bind_addr, uint16_t port) {
  if (!bind_addr.empty()) return listen_socket(bind_addr, port);
  try {
    return listen_socket("::", port);
  } catch (const std::system_error&) {
    return listen_socket("0.0.0.0", port);
  }
}

}  // namespace

HostedStore::HostedStore(const std::string& host, c10d::TCPStoreOptions options, int public_fd,
                         const std::string& where)
    : c10d::TCPStore(host, options) {
  gate_ = std::make_unique<StoreGate>(public_fd, getPort(), compat::store_protocol(), where);
}

HostedStore::~HostedStore() = default;

uint16_t HostedStore::public_port() const { return gate_->port(); }

int HostedStore::refused() const { return gate_->refused(); }

c10::intrusive_ptr<HostedStore> host_store(const std::string& host, uint16_t port, milliseconds timeout,
                                           const std::string& bind_addr) {
  const bool wildcard = bind_addr.empty() || is_wildcard_address(bind_addr);
  const std::string listen_on = wildcard ? "" : " (listening on " + endpoint(bind_addr, port) + ")";
  int public_fd = -1;
  int server_fd = -1;
  try {
    public_fd = public_listen_socket(wildcard ? "" : bind_addr, port);
    const uint16_t real_port = static_cast<uint16_t>(sys::local_port(public_fd));
    std::optional<BindSteering> steering;
    auto o = loopback_server_options(timeout, steering, server_fd);
    c10::intrusive_ptr<HostedStore> store;
    try {
      try {
        store = c10::make_intrusive<HostedStore>("127.0.0.1", o, public_fd, endpoint(host, real_port));
      } catch (const std::exception& e) {
        // 2.4's libuv server refuses the handed-over socket; its legacy server takes it.
        if (!compat::use_legacy_store_server(o, e)) throw;
        store = c10::make_intrusive<HostedStore>("127.0.0.1", o, public_fd, endpoint(host, real_port));
      }
    } catch (...) {
      if (server_fd >= 0) ::close(server_fd);
      throw;  // public_fd: closed below unless the gate took it
    }
    public_fd = -1;  // the gate owns it
    if (steering && (!steering->interposed() || steering->applied() == 0)) {
      std::fprintf(stderr,
                   "[lspawn] warning: the rendezvous store's server (behind its gate at %s) listens "
                   "on every interface (this LibTorch binds its own socket, and lspawn's bind() is "
                   "not the one linked into this program)\n",
                   endpoint(host, real_port).c_str());
    }
    store->setTimeout(timeout);
    return store;
  } catch (const std::exception& e) {
    if (public_fd >= 0) ::close(public_fd);
    throw RendezvousError("cannot host the rendezvous store at " + endpoint(host, port) + listen_on +
                          " (is the port in use, or MASTER_ADDR not this host?): " + e.what());
  }
}

c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, uint16_t port, milliseconds timeout) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  milliseconds backoff{2};
  std::string why;
  int attempts = 0;
  // TCPStore's client sleeps 1 s between refused attempts; probe with a short backoff instead
  // and hand over to TCPStore once the server listens. A probe that got no answer waits twice as
  // long the next time: a handshake takes a round trip, and on a link whose round trip is over
  // 1 s (or that lost the SYN twice) a fixed 1 s wait never saw one complete, so the rank retried
  // until the rendezvous timeout (#47, docs/reliability.md "Slow and lossy links").
  milliseconds probe_wait{1000};
  while (true) {
    ++attempts;
    bool timed_out = false;
    why = probe_listener(host, port, std::min(remaining(deadline), probe_wait), timed_out);
    if (why.empty()) break;
    if (timed_out) probe_wait *= 2;
    if (Clock::now() + backoff >= deadline) {
      throw RendezvousError("cannot connect to the rendezvous store at " + endpoint(host, port) + " after " +
                            elapsed_text(since(t0)) + " (timeout " + seconds_text(timeout) + ", " +
                            std::to_string(attempts) + " attempts): " + why);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(100));
  }
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.waitWorkers = false;
  // The server listens: connecting is immediate. TCPStore 1.13 truncates its connect timeout to
  // whole seconds, so a sub-second remainder would fail at once; give it at least 2 s.
  o.timeout = std::max(remaining(deadline), kMinConnectTimeout);
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(host, o);
    store->setTimeout(timeout);
    return store;
  } catch (const std::exception& e) {
    throw RendezvousError("cannot connect to the rendezvous store at " + endpoint(host, port) + " after " +
                          elapsed_text(since(t0)) + " (timeout " + seconds_text(timeout) + "): " + e.what());
  }
}

namespace {

// One rank's rendezvous (rendezvous() below): the state its steps share and the errors they
// throw, each naming the run, the endpoint, the time taken and this rank.
struct Meeting {
  const WorkerEnv& env;
  const Clock::time_point t0 = Clock::now();
  const milliseconds timeout;
  const milliseconds store_timeout;
  const Clock::time_point deadline = t0 + timeout;
  const int n = env.world_size;
  Rendezvous out;

  Meeting(const WorkerEnv& e, const RendezvousOptions& options)
      : env(e),
        timeout(resolve_rendezvous_timeout(options.timeout)),
        store_timeout(options.store_timeout.count() > 0 ? options.store_timeout : timeout) {
    out.host = env.master_addr;
    out.port = env.master_port;
  }

  std::string where() const { return endpoint(out.host, out.port); }
  std::string who() const { return "rank " + std::to_string(env.rank) + "/" + std::to_string(n); }
  RendezvousTimeout timed_out(int joined, const std::vector<int>& missing) const {
    return RendezvousTimeout("rendezvous '" + env.run_id + "' timed out after " + elapsed_text(since(t0)) +
                                 " (timeout " + seconds_text(timeout) + ") at " + where() + ": " +
                                 std::to_string(joined) + "/" + std::to_string(n) +
                                 " ranks joined, missing: " + rank_list(missing) + " (seen from " + who() + ")",
                             missing);
  }
  // Any store failure (other than our own timeouts) means the store went away or broke.
  RendezvousError lost(const std::exception& e) const {
    return RendezvousError("rendezvous '" + env.run_id + "' (" + who() + ") lost the store at " + where() + " after " +
                           elapsed_text(since(t0)) + ": " + e.what());
  }
  c10d::Store& store() { return *out.store; }

  void open_store();
  std::vector<std::string> arbitrate();
  std::vector<std::string> await_outcome();
  void read_peers(const std::vector<std::string>& records);
  void confirm_reads();
};

// Rank 0 hosts the TCPStore (unless under an agent's store), the others connect; then the
// secret's record authentication and the run's key prefix on top.
void Meeting::open_store() {
  if (env.rank == 0 && !env.use_agent_store) {
    std::string bind_addr;
    try {
      bind_addr = store_bind_address(env);
    } catch (const std::exception& e) {
      throw RendezvousError(who() + ": " + e.what());
    }
    auto hosted = host_store(env.master_addr, env.master_port, timeout, bind_addr);
    out.port = hosted->public_port();
    out.tcp_store = std::move(hosted);
  } else {
    try {
      out.tcp_store = connect_store(env.master_addr, env.master_port, timeout);
    } catch (const RendezvousError& e) {
      if (env.use_agent_store) throw;
      // connect_store() retries until the timeout: the store is hosted by rank 0, so not reaching
      // it means rank 0 is missing.
      auto t = timed_out(0, {0});
      throw RendezvousTimeout(std::string(t.what()) + "; " + e.what(), {0});
    }
  }
  out.tcp_store->setTimeout(store_timeout);
  c10::intrusive_ptr<c10d::Store> base = out.tcp_store;
  if (!env.job_secret.empty()) {
    // The round's key, not the job's: a worker of an earlier round is fenced out (record_auth.hpp).
    out.auth = c10::make_intrusive<AuthenticatedStore>(
        out.tcp_store, RecordAuth::for_round(env.job_secret, env.run_id, env.restart_count), who());
    out.auth->watch_strangers(true);
    base = out.auth;
  }
  out.store =
      c10::make_intrusive<c10d::PrefixStore>("lspawn/" + env.run_id + "/" + std::to_string(env.restart_count), base);
}

// Rank 0, the arbiter: waits for everyone, then publishes the outcome; returns every rank's
// announcement, or throws the timeout naming the missing ranks once the joined ones read it.
std::vector<std::string> Meeting::arbitrate() {
  std::vector<std::string> all_ranks;
  for (int r = 0; r < n; ++r) all_ranks.push_back(rank_key(r));
  bool all_joined = true;
  try {
    store().wait(all_ranks, remaining(deadline));
  } catch (const std::exception& e) {
    // A store really lost in the slack still says so: find_missing() below fails.
    if (Clock::now() + kTimerSlack < deadline) throw lost(e);
    all_joined = false;
  }
  if (!all_joined) {
    Outcome o;
    try {
      o.missing = find_missing(store(), n);
    } catch (const std::exception& e) {
      throw lost(e);
    }
    o.joined = n - static_cast<int>(o.missing.size());
    try {
      store().set(kOutcomeKey, bytes(encode_outcome(o)));
      // Keep the store up until the joined ranks have read the outcome (bounded).
      std::vector<std::string> readers;
      for (int r = 1; r < n; ++r) {
        if (!std::binary_search(o.missing.begin(), o.missing.end(), r)) readers.push_back(read_key(r));
      }
      if (!readers.empty()) store().wait(readers, kOutcomeGrace);
    } catch (const std::exception&) {
      // Best effort: a reader that does not acknowledge still times out on its own.
    }
    throw timed_out(o.joined, o.missing);
  }
  Outcome ok{true, n, {}, {}};
  try {
    for (int r = 0; r < n; ++r) ok.records.push_back(text(get_when_set(store(), rank_key(r))));
    store().set(kOutcomeKey, bytes(encode_outcome(ok)));
  } catch (const std::exception& e) {
    throw lost(e);
  }
  return std::move(ok.records);
}

// The other ranks: wait for the arbiter's outcome, allowing it the grace to publish after its own
// deadline; without word from rank 0 (hung, or under an agent store, never arrived), judge alone.
std::vector<std::string> Meeting::await_outcome() {
  std::string outcome_text;
  try {
    store().wait({kOutcomeKey}, remaining(deadline) + kOutcomeGrace);
    outcome_text = text(get_when_set(store(), kOutcomeKey));
  } catch (const std::exception& e) {
    if (Clock::now() < deadline) throw lost(e);
    std::vector<int> missing;
    try {
      missing = find_missing(store(), n);
    } catch (const std::exception&) {
      missing = {0};
    }
    throw timed_out(n - static_cast<int>(missing.size()), missing);
  }
  Outcome o = decode_outcome(outcome_text, static_cast<size_t>(n));
  if (!o.ok) {
    try {
      store().set(read_key(env.rank), bytes("1"));
    } catch (const std::exception&) {
      // Acknowledgement only.
    }
    throw timed_out(o.joined, o.missing);
  }
  return std::move(o.records);
}

// Everyone joined: the announcements (from the outcome, else from the store), then this rank's
// acknowledgement.
void Meeting::read_peers(const std::vector<std::string>& records) {
  out.peers.resize(n);
  for (int r = 0; r < n; ++r) {
    const std::string record = records.empty() ? text(store().get(rank_key(r))) : records[r];
    out.peers[r] = parse_peer(r, record, where());
  }
  if (env.rank != 0) store().set(read_key(env.rank), bytes("1"));
}

// Rank 0 returns only once every rank has read the outcome, so that it (the store's host) may go
// away after rendezvous() without cutting a slower rank off mid-read.
void Meeting::confirm_reads() {
  if (env.rank != 0 || n <= 1) return;
  std::vector<std::string> readers;
  for (int r = 1; r < n; ++r) readers.push_back(read_key(r));
  try {
    store().wait(readers, std::max(remaining(deadline), kOutcomeGrace));
  } catch (const std::exception& e) {
    std::vector<int> silent;
    for (int r = 1; r < n; ++r) {
      if (!store().check({read_key(r)})) silent.push_back(r);
    }
    if (silent.empty()) throw;
    throw RendezvousError("rendezvous '" + env.run_id + "' at " + where() + ": all " + std::to_string(n) +
                          " ranks joined, but ranks " + rank_list(silent) + " did not confirm within " +
                          elapsed_text(since(t0)) + " (did they die?)");
  }
}

}  // namespace

Rendezvous rendezvous(const WorkerEnv& env, const RendezvousOptions& options) {
  Meeting m(env, options);
  m.open_store();
  try {
    m.store().set(rank_key(env.rank), bytes(this_host() + "\n" + std::to_string(::getpid())));
  } catch (const std::exception& e) {
    throw m.lost(e);
  }
  const std::vector<std::string> records = env.rank == 0 ? m.arbitrate() : m.await_outcome();
  try {
    m.read_peers(records);
    m.confirm_reads();
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& e) {
    throw m.lost(e);
  }
  m.out.elapsed = since(m.t0);
  return std::move(m.out);
}

}  // namespace lspawn
