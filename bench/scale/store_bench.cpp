// lspawn_bench_store: rank 0's rendezvous store under W simulated ranks (issue #35,
// docs/scale-store.md).
//
// Per measurement this process hosts one store, in one of these modes:
//   tcpstore        c10d's TCPStore server on 127.0.0.1 as lspawn configures it
//                   (runtime/rendezvous.cpp: waitWorkers off; on 2.x useLibUV off);
//   tcpstore-libuv  the same with TCPStoreOptions::useLibUV (2.x only: PyTorch 2.4+'s default);
//   gate            lspawn's real path: lspawn::host_store(), the StoreGate
//                   (runtime/store_gate.hpp) in front of a TCPStore on loopback, as rank 0 runs it;
// and forks C client processes, each holding W/C TCPStore client connections (one per simulated
// rank). Every rank then does what a worker's start asks of rank 0's store:
//   1. set its address key "default_pg/0/rank_<r>" (60 bytes: gloo's connectFullMesh publishes
//      its address so), then add(1) to "store_based_barrier_key:1"; the rank whose add returns W
//      sets "store_based_barrier_key:1:last_worker" (torch 2.1+'s _store_based_barrier);
//   2. wait for "…:last_worker";
//   3. get `--peers N` peers' address keys (ranks r+1 … r+N mod W; gloo's full mesh gets all W-1,
//      W² gets in all: gloo's growth, not the store's or the gate's).
// A client process runs its ranks one after another through each step (so a step of one process
// is W/C requests in a row, and C processes run at once).
//
// Measured: init_s (the fork's "go" to the last rank done, client connections included),
// ops_per_s (store calls, W·(3 + peers) + 1, over init_s), server_cpu_s (this process's CPU while
// the ranks run: the store server's threads, and the gate's). Printed as a table, modes side by
// side; --json PATH appends one JSON object per measurement.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "runtime/rendezvous.hpp"
#include "runtime/torch_compat.hpp"

namespace {

using namespace std::chrono_literals;

constexpr const char* kBarrierKey = "store_based_barrier_key:1";
constexpr const char* kLastWorkerKey = "store_based_barrier_key:1:last_worker";
constexpr std::size_t kAddressBytes = 60;

struct Options {
  std::vector<std::string> modes;
  std::vector<long> worlds{64, 256, 1024};
  int clients = 16;
  long peers = 8;  // -1: all
  int repeat = 1;
  int timeout_s = 600;
  std::string json;
};

double now_s() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double process_cpu_s(int who) {
  rusage u{};
  ::getrusage(who, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

bool has_libuv() { return lspawn::compat::HasLibUVChoice<c10d::TCPStoreOptions>::value; }

template <typename O>
void set_libuv(O& o, bool on) {
  if constexpr (lspawn::compat::HasLibUVChoice<O>::value) {
    o.useLibUV = on;
  } else {
    (void)o;
    (void)on;
  }
}

// Whether the TCPStore `s` runs the libuv server ("libuv"), else "legacy".
template <typename S>
auto backend_name(const S& s, int) -> decltype(s.isLibUvBackend(), std::string()) {
  return s.isLibUvBackend() ? "libuv" : "legacy";
}
template <typename S>
std::string backend_name(const S&, long) {
  return "legacy";
}

std::string tool_name(const std::string& mode) { return mode == "gate" ? "lspawn-gate" : mode; }

// One hosted store: its port and, for the table, the server behind it.
struct HostedServer {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::uint16_t port = 0;
  std::string backend;
};

HostedServer host(const std::string& mode, std::chrono::milliseconds timeout) {
  HostedServer h;
  if (mode == "gate") {
    auto hosted = lspawn::host_store("127.0.0.1", 0, timeout, "127.0.0.1");  // rank 0's own path
    h.port = hosted->public_port();
    h.backend = backend_name(static_cast<const c10d::TCPStore&>(*hosted), 0);
    h.store = hosted;
    return h;
  }
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = timeout;
  set_libuv(o, mode == "tcpstore-libuv");
  h.store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  h.port = h.store->getPort();
  h.backend = backend_name(*h.store, 0);
  return h;
}

// What a client process sends back (one write, smaller than PIPE_BUF: atomic on the shared pipe).
struct Report {
  double connected = 0;  // CLOCK_MONOTONIC when its last client was connected
  double done = 0;       // when its last rank finished step 3
  long ops = 0;
  char error[512] = {0};
};

std::string address_of(long r) {
  std::string v = "127.0.0.1:" + std::to_string(20000 + r % 40000) + " rank " + std::to_string(r) + " ";
  v.resize(kAddressBytes, '.');
  return v;
}

std::string address_key(long r) { return "default_pg/0/rank_" + std::to_string(r); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// The body of one client process: ranks [first, first + count) of W.
Report run_ranks(std::uint16_t port, long first, long count, long world, long peers,
                 std::chrono::milliseconds timeout) {
  Report rep;
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> ranks;
  ranks.reserve(count);
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  for (long i = 0; i < count; ++i) ranks.push_back(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
  rep.connected = now_s();
  for (long i = 0; i < count; ++i) {
    ranks[i]->set(address_key(first + i), bytes(address_of(first + i)));
    if (ranks[i]->add(kBarrierKey, 1) == world) {
      ranks[i]->set(kLastWorkerKey, bytes("1"));
      ++rep.ops;
    }
    rep.ops += 2;
  }
  for (long i = 0; i < count; ++i) {
    ranks[i]->wait({kLastWorkerKey});
    ++rep.ops;
  }
  const long n = std::min(peers, world - 1);
  for (long i = 0; i < count; ++i) {
    for (long k = 1; k <= n; ++k) {
      const long peer = (first + i + k) % world;
      const auto v = ranks[i]->get(address_key(peer));
      if (v.size() != kAddressBytes)
        throw std::runtime_error("rank " + std::to_string(first + i) + ": key " + address_key(peer) + " has " +
                                 std::to_string(v.size()) + " bytes");
      ++rep.ops;
    }
  }
  rep.done = now_s();
  return rep;
}

struct Measurement {
  std::string mode, backend, error;
  long world = 0;
  double init_s = 0, connect_s = 0, server_cpu_s = 0, client_cpu_s = 0;
  long ops = 0;
};

void write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Reads exactly n bytes before `deadline` (CLOCK_MONOTONIC seconds); false on EOF or time out.
bool read_all(int fd, void* p, std::size_t n, double deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int left_ms = static_cast<int>(std::max(0.0, (deadline - now_s()) * 1000));
    const int k = ::poll(&pfd, 1, left_ms);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    const ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

Measurement measure(const std::string& mode, long world, const Options& opt) {
  Measurement m;
  m.mode = mode;
  m.world = world;
  const int clients = static_cast<int>(std::min<long>(opt.clients, world));
  // Descriptors the hosting process needs: 1 per client connection on TCPStore's server; behind
  // the gate 3 per connection that speaks (client, store side, server) and 1 per silent one
  // (1.13's watch-key connection, which the gate never relays).
  const bool legacy = lspawn::compat::store_protocol() == lspawn::StoreProtocol::Legacy;
  const long fds = world * (mode == "gate" ? (legacy ? 4 : 3) : (legacy ? 2 : 1)) + 64;
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (static_cast<rlim_t>(fds) > rl.rlim_cur) {
    m.error = "needs about " + std::to_string(fds) + " descriptors in the store's process, RLIMIT_NOFILE is " +
              std::to_string(rl.rlim_cur) + " (raising it needs CAP_SYS_RESOURCE)";
    return m;
  }
  const auto timeout = std::chrono::milliseconds(opt.timeout_s * 1000L);
  int go[2], back[2];
  if (::pipe2(go, O_CLOEXEC) != 0 || ::pipe2(back, O_CLOEXEC) != 0) {
    m.error = std::string("pipe: ") + std::strerror(errno);
    return m;
  }
  // The client processes first, before this process has a server's threads: they wait for the
  // port on `go`.
  std::vector<pid_t> pids;
  for (int c = 0; c < clients; ++c) {
    const long first = world * c / clients, last = world * (c + 1) / clients;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(go[1]);
      ::close(back[0]);
      Report rep;
      std::uint16_t port = 0;
      if (!read_all(go[0], &port, sizeof port, now_s() + opt.timeout_s)) ::_exit(3);
      try {
        rep = run_ranks(port, first, last - first, world, opt.peers < 0 ? world : opt.peers, timeout);
      } catch (const std::exception& e) {
        std::snprintf(rep.error, sizeof rep.error, "client process %d (ranks %ld-%ld): %s", c, first, last - 1,
                      e.what());
      }
      write_all(back[1], &rep, sizeof rep);
      ::_exit(0);  // the kernel closes the clients' sockets: no destructor per client
    }
    if (pid < 0) {
      m.error = std::string("fork: ") + std::strerror(errno);
      break;
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(back[1]);
  HostedServer server;
  double t0 = 0, cpu0 = 0, cpu_children0 = process_cpu_s(RUSAGE_CHILDREN);
  std::vector<Report> reports;
  if (m.error.empty()) {
    try {
      server = host(mode, timeout);
      m.backend = server.backend;
      cpu0 = process_cpu_s(RUSAGE_SELF);
      t0 = now_s();
      for (std::size_t c = 0; c < pids.size(); ++c) write_all(go[1], &server.port, sizeof server.port);
      for (std::size_t c = 0; c < pids.size(); ++c) {
        Report rep;
        if (!read_all(back[0], &rep, sizeof rep, t0 + opt.timeout_s + 10)) {
          m.error = "a client process did not report within " + std::to_string(opt.timeout_s) + " s";
          break;
        }
        if (rep.error[0] && m.error.empty()) m.error = rep.error;
        reports.push_back(rep);
      }
      m.server_cpu_s = process_cpu_s(RUSAGE_SELF) - cpu0;
    } catch (const std::exception& e) {
      m.error = std::string("hosting the store: ") + e.what();
    }
  }
  ::close(go[1]);
  ::close(back[0]);
  for (pid_t pid : pids) {
    if (!m.error.empty()) ::kill(pid, SIGKILL);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  }
  m.client_cpu_s = process_cpu_s(RUSAGE_CHILDREN) - cpu_children0;
  server.store.reset();
  if (m.error.empty()) {
    double connected = 0, done = 0;
    for (const auto& r : reports) {
      connected = std::max(connected, r.connected);
      done = std::max(done, r.done);
      m.ops += r.ops;
    }
    m.connect_s = connected - t0;
    m.init_s = done - t0;
  }
  return m;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "lspawn_bench_store: %s\n"
               "usage: lspawn_bench_store [--modes tcpstore,tcpstore-libuv,gate] [--worlds 64,256,1024]\n"
               "         [--clients C] [--peers N|all] [--repeat R] [--timeout S] [--json PATH]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--modes") {
      o.modes = split(value());
    } else if (a == "--worlds") {
      o.worlds.clear();
      for (const auto& w : split(value())) o.worlds.push_back(std::stol(w));
    } else if (a == "--clients") {
      o.clients = std::stoi(value());
    } else if (a == "--peers") {
      const std::string v = value();
      o.peers = v == "all" ? -1 : std::stol(v);
    } else if (a == "--repeat") {
      o.repeat = std::stoi(value());
    } else if (a == "--timeout") {
      o.timeout_s = std::stoi(value());
    } else if (a == "--json") {
      o.json = value();
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (o.modes.empty()) {
    o.modes = {"tcpstore"};
    if (has_libuv()) o.modes.push_back("tcpstore-libuv");
    o.modes.push_back("gate");
  }
  for (const auto& m : o.modes) {
    if (m != "tcpstore" && m != "tcpstore-libuv" && m != "gate") usage("unknown mode '" + m + "'");
    if (m == "tcpstore-libuv" && !has_libuv())
      usage("tcpstore-libuv: this LibTorch (" + lspawn::compat::torch_version() + ") has no libuv server");
  }
  if (o.clients < 1 || o.repeat < 1) usage("--clients and --repeat must be at least 1");
  return o;
}

long read_long(const char* path, int field = 0) {
  std::ifstream f(path);
  long v = -1;
  for (int i = 0; i <= field && (f >> v); ++i) {}
  return v;
}

// The limits W simulated ranks meet on one machine: descriptors (raised here, hard limit too, up
// to fs.nr_open), ephemeral ports and threads (said, not changed: store.py may widen the ports).
void raise_limits(const Options& o) {
  const long nr_open = read_long("/proc/sys/fs/nr_open");
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const rlim_t want = nr_open > 0 ? static_cast<rlim_t>(nr_open) : rl.rlim_max;
  rlimit up{want, want};
  if (::setrlimit(RLIMIT_NOFILE, &up) != 0) {
    up = {rl.rlim_max, rl.rlim_max};
    ::setrlimit(RLIMIT_NOFILE, &up);
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const long wmax = *std::max_element(o.worlds.begin(), o.worlds.end());
  // 1.13's client opens a second connection (the watch-key callback one) and a thread.
  const int per_rank = lspawn::compat::store_protocol() == lspawn::StoreProtocol::Legacy ? 2 : 1;
  const long lo = read_long("/proc/sys/net/ipv4/ip_local_port_range", 0);
  const long hi = read_long("/proc/sys/net/ipv4/ip_local_port_range", 1);
  std::printf(
      "# limits: RLIMIT_NOFILE %llu (fs.nr_open %ld); ephemeral ports %ld-%ld (%ld); W=%ld needs %ld "
      "connections per hop (%d per rank); somaxconn %ld; pid_max %ld\n",
      static_cast<unsigned long long>(rl.rlim_cur), nr_open, lo, hi, hi - lo + 1, wmax, wmax * per_rank, per_rank,
      read_long("/proc/sys/net/core/somaxconn"), read_long("/proc/sys/kernel/pid_max"));
  if (wmax * per_rank > hi - lo + 1) {
    std::printf(
        "# warning: more connections per destination than ephemeral ports: widen "
        "net.ipv4.ip_local_port_range (store.py does, as root)\n");
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  raise_limits(opt);
  const long peers_shown = opt.peers;
  std::printf("# LibTorch %s, %d client processes, peers %s, repeat %d (median), %ld CPUs, load %.2f\n",
              lspawn::compat::torch_version().c_str(), opt.clients,
              peers_shown < 0 ? "all" : std::to_string(peers_shown).c_str(), opt.repeat, sysconf(_SC_NPROCESSORS_ONLN),
              [] {
                double l[1] = {0};
                ::getloadavg(l, 1);
                return l[0];
              }());
  std::fflush(stdout);  // before the measurements' lines on stderr
  std::FILE* json = opt.json.empty() ? nullptr : std::fopen(opt.json.c_str(), "a");
  if (!opt.json.empty() && !json) usage("cannot open " + opt.json + ": " + std::strerror(errno));
  // (mode, W) → the repetitions.
  std::map<std::pair<std::string, long>, std::vector<Measurement>> all;
  std::map<std::string, std::string> backend;
  bool failed = false;
  for (long w : opt.worlds) {
    for (int rep = 0; rep < opt.repeat; ++rep) {
      for (const auto& mode : opt.modes) {  // modes interleaved: each repetition sees the same load
        Measurement m = measure(mode, w, opt);
        if (!m.backend.empty()) backend[mode] = m.backend;
        if (!m.error.empty()) {
          std::fprintf(stderr, "%s W=%ld: failed: %s\n", mode.c_str(), w, m.error.c_str());
          failed = true;
        } else {
          std::fprintf(
              stderr, "%-15s W=%-6ld init %.3f s (connect %.3f s), %.0f ops/s, server CPU %.3f s, clients CPU %.3f s\n",
              mode.c_str(), w, m.init_s, m.connect_s, m.ops / m.init_s, m.server_cpu_s, m.client_cpu_s);
          if (json) {
            const std::pair<const char*, double> metrics[] = {{"init_s", m.init_s},
                                                              {"ops_per_s", m.ops / m.init_s},
                                                              {"server_cpu_s", m.server_cpu_s},
                                                              {"connect_s", m.connect_s},
                                                              {"client_cpu_s", m.client_cpu_s}};
            for (const auto& [name, value] : metrics) {
              std::fprintf(json,
                           "{\"bench\":\"store\",\"tool\":\"%s\",\"W\":%ld,\"metric\":\"%s\",\"value\":%.6g,"
                           "\"rep\":%d,\"torch\":\"%s\",\"server\":\"%s\",\"clients\":%d,\"peers\":%ld}\n",
                           tool_name(mode).c_str(), w, name, value, rep, lspawn::compat::torch_version().c_str(),
                           m.backend.c_str(), opt.clients, opt.peers);
            }
            std::fflush(json);
          }
        }
        all[{mode, w}].push_back(std::move(m));
      }
    }
  }
  if (json) std::fclose(json);

  // The table: W as rows, each mode's median init time, ops/s and server CPU as columns.
  std::printf("\n%7s", "W");
  for (const auto& mode : opt.modes) {
    const std::string head =
        tool_name(mode) + (mode == "gate" && !backend[mode].empty() ? "(" + backend[mode] + ")" : "");
    std::printf(" | %-30s", head.c_str());
  }
  if (std::find(opt.modes.begin(), opt.modes.end(), "gate") != opt.modes.end()) std::printf(" | gate/same server");
  std::printf("\n%7s", "");
  for (std::size_t i = 0; i < opt.modes.size(); ++i) std::printf(" | %8s %10s %10s", "init_s", "ops/s", "srv_cpu_s");
  std::printf("\n");
  for (long w : opt.worlds) {
    std::printf("%7ld", w);
    std::map<std::string, double> init;
    for (const auto& mode : opt.modes) {
      std::vector<double> t, ops, cpu;
      for (const auto& m : all[{mode, w}]) {
        if (!m.error.empty()) continue;
        t.push_back(m.init_s);
        ops.push_back(m.ops / m.init_s);
        cpu.push_back(m.server_cpu_s);
      }
      if (t.empty()) {
        std::printf(" | %-30s", "failed");
        continue;
      }
      init[mode] = median(t);
      std::printf(" | %8.3f %10.0f %10.3f", median(t), median(ops), median(cpu));
    }
    // The gate against TCPStore with the server that runs behind it.
    const std::string same = backend["gate"] == "libuv" ? "tcpstore-libuv" : "tcpstore";
    if (init.count("gate") && init.count(same)) std::printf(" | %.2f (vs %s)", init["gate"] / init[same], same.c_str());
    std::printf("\n");
  }
  return failed ? 1 : 0;
}
