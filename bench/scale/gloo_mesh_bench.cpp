// lspawn_bench_gloo_mesh: the store side of gloo's full-mesh connect (issue #35) for W simulated
// ranks, through lspawn's store chain, with gloo's batched read (multiGet) and without it, side
// by side. docs/scale-gloo-mesh.md.
//
//   lspawn_bench_gloo_mesh [--world 64,256,1024] [--threads 64] [--no-pair-ids] [--modes a,b,..]
//
// Each simulated rank does what gloo's tcp Context::createAndConnectAllPairs does with its store
// (gloo/transport/tcp/context.cc): set its own record "0/<rank>" (hostname, sockaddr and, unless
// --no-pair-ids, W 8-byte pair ids: gloo's default), then read all W records, either
//   sequential: wait({key}) then get(key) per record (gloo's wait_get; what it does when the store
//               says !hasExtendedApi() or GLOO_ENABLE_STORE_V2_API is unset), or
//   batched:    one multiGet per 128 records (kDefaultBatchSize; hasExtendedApi() and the env).
// The store chain is init_process_group's: TCPStore client <- AuthenticatedStore (watching
// strangers, as during the connect) <- PrefixStore (run) <- PrefixStore ("gloo") <-
// GlooConnectStore, over rank 0's store as rendezvous() hosts it (host_store(): TCPStore behind
// lspawn's gate). Modes *-nowatch turn the stranger watch off.
//
// Ranks are store clients, not gloo processes: no pair is connected. A pool of --threads threads
// drives them (thread t owns ranks t, t+T, ...; each rank its own TCPStore connection); each thread
// sets all its ranks' records before it reads, so no rank waits on one its own thread has not run.
// wall_s: from the moment every client is connected to the last rank's last read.
// requests: what the TCPStore clients send (get and multiGet send WAIT then GET / MULTI_GET).
// Prints a table and one JSON line per run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "runtime/authenticated_store.hpp"
#include "runtime/gloo_connect_store.hpp"
#include "runtime/record_auth.hpp"
#include "runtime/rendezvous.hpp"
#include "runtime/store_extended_api.hpp"
#include "runtime/torch_compat.hpp"
#include "support/counting_store.hpp"  // CountingStore (tests/support)

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kBatch = 128;  // gloo's kDefaultBatchSize
const std::string kSecret = "0123456789abcdef0123456789abcdef";

// What the TCPStore clients sent: get and multiGet send WAIT then GET / MULTI_GET.
long requests_on_the_wire(const lspawn::test::StoreCounts& c) {
  return c.wait + 2 * c.get + 2 * c.multi_get + c.check + c.set;
}

struct Mode {
  std::string name;
  bool batched;
  bool watch;
};

struct Result {
  double wall_s = 0;
  long requests = 0;
  long multi_gets = 0, gets = 0;
  std::string error;
};

// gloo's Rank record: hostname, a sockaddr_storage-sized address, W pair ids.
std::vector<uint8_t> rank_record(int rank, int world, bool pair_ids) {
  std::vector<uint8_t> v(8 + 16 + 8 + 128 + (pair_ids ? 8 * world : 0), 0);
  std::snprintf(reinterpret_cast<char*>(v.data()) + 8, 16, "node%05d", rank);
  return v;
}

Result run(int world, const Mode& mode, int threads, bool pair_ids) {
  Result res;
  auto server = lspawn::host_store("127.0.0.1", 0, 600s);
  auto requests = std::make_shared<lspawn::test::StoreCounts>();
  std::atomic<int> failures{0};
  std::string first_error;
  std::mutex m;
  const int T = std::min(threads, world);
  // Every thread connects its ranks' clients first; the clock starts when all have (connecting
  // is not gloo's connect, and 2.x's TCPStore makes a reverse DNS query per connection).
  std::mutex start_m;
  std::condition_variable start_cv;
  int connected = 0;
  Clock::time_point t0;
  auto all_connected = [&] {
    std::unique_lock<std::mutex> lock(start_m);
    if (++connected == T) {
      t0 = Clock::now();
      start_cv.notify_all();
    } else {
      start_cv.wait(lock, [&] { return connected >= T; });
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < T; ++t) {
    pool.emplace_back([&, t] {
      bool counted_in = false;
      try {
        std::vector<c10::intrusive_ptr<c10d::Store>> stores;
        std::vector<int> mine;
        for (int r = t; r < world; r += T) {
          auto client = lspawn::connect_store("127.0.0.1", server->public_port(), 600s);
          client->setTimeout(600s);
          auto counted = c10::make_intrusive<lspawn::test::CountingStore>(client, requests);
          auto auth = c10::make_intrusive<lspawn::AuthenticatedStore>(
              counted, lspawn::RecordAuth(kSecret), "rank " + std::to_string(r) + "/" + std::to_string(world));
          auth->watch_strangers(mode.watch);
          auto run_store = c10::make_intrusive<c10d::PrefixStore>("lspawn/bench/0", auth);
          stores.push_back(
              c10::make_intrusive<lspawn::GlooConnectStore>(c10::make_intrusive<c10d::PrefixStore>("gloo", run_store)));
          mine.push_back(r);
        }
        counted_in = true;
        all_connected();
        for (size_t i = 0; i < mine.size(); ++i) {
          stores[i]->set("0/" + std::to_string(mine[i]), rank_record(mine[i], world, pair_ids));
        }
        for (size_t i = 0; i < mine.size(); ++i) {
          auto& store = *stores[i];
          size_t bytes = 0;
          if (mode.batched) {
            for (int first = 0; first < world; first += kBatch) {
              std::vector<std::string> keys;
              for (int k = first; k < std::min(world, first + kBatch); ++k) keys.push_back("0/" + std::to_string(k));
              for (const auto& v : lspawn::compat::multi_get<c10d::Store>(store, keys)) bytes += v.size();
            }
          } else {
            for (int k = 0; k < world; ++k) {
              const std::string key = "0/" + std::to_string(k);
              store.wait({key}, 600s);
              bytes += store.get(key).size();
            }
          }
          if (bytes != static_cast<size_t>(world) * rank_record(0, world, pair_ids).size()) {
            throw std::runtime_error("read " + std::to_string(bytes) + " bytes");
          }
        }
      } catch (const std::exception& e) {
        if (!counted_in) all_connected();  // failed while connecting: do not hold the others
        ++failures;
        std::lock_guard<std::mutex> lock(m);
        if (first_error.empty()) first_error = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  res.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  res.requests = requests_on_the_wire(*requests);
  res.multi_gets = requests->multi_get;
  res.gets = requests->get;
  if (failures > 0) res.error = std::to_string(failures.load()) + " threads failed: " + first_error;
  return res;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds{64, 256, 1024};
  int threads = 64;
  bool pair_ids = true;
  std::vector<std::string> mode_names{"sequential", "batched"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--world" && i + 1 < argc) {
      worlds.clear();
      for (const auto& w : split(argv[++i])) worlds.push_back(std::stoi(w));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--no-pair-ids") {
      pair_ids = false;
    } else if (a == "--modes" && i + 1 < argc) {
      mode_names = split(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--world 64,256,1024] [--threads 64] [--no-pair-ids] "
                   "[--modes sequential,batched,sequential-nowatch,batched-nowatch]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<Mode> modes;
  for (const auto& n : mode_names) {
    const bool nowatch = n.size() > 8 && n.compare(n.size() - 8, 8, "-nowatch") == 0;
    const std::string base = nowatch ? n.substr(0, n.size() - 8) : n;
    if (base != "sequential" && base != "batched") {
      std::fprintf(stderr, "unknown mode '%s'\n", n.c_str());
      return 2;
    }
    modes.push_back({n, base == "batched", !nowatch});
  }
  if (!lspawn::compat::kStoreHasExtendedApi) {
    std::printf("# LibTorch %s: c10d::Store has no multiGet; 'batched' reads key by key\n",
                lspawn::compat::torch_version().c_str());
  }
  std::printf("# LibTorch %s, %d threads, record %zu bytes at W=1024 (%s)\n", lspawn::compat::torch_version().c_str(),
              threads, rank_record(0, 1024, pair_ids).size(), pair_ids ? "with W pair ids" : "no pair ids");
  std::printf("%6s  %-20s %10s %12s %10s %10s  %s\n", "W", "mode", "wall_s", "requests", "req/rank", "multiGet",
              "error");
  for (int w : worlds) {
    for (const auto& mode : modes) {
      const auto r = run(w, mode, threads, pair_ids);
      std::printf("%6d  %-20s %10.2f %12ld %10.1f %10ld  %s\n", w, mode.name.c_str(), r.wall_s, r.requests,
                  static_cast<double>(r.requests) / w, r.multi_gets, r.error.c_str());
      std::printf(
          "{\"bench\":\"gloo_mesh\",\"torch\":\"%s\",\"world\":%d,\"mode\":\"%s\",\"threads\":%d,\"pair_ids\":%s,"
          "\"wall_s\":%.3f,\"requests\":%ld,\"gets\":%ld,\"multi_gets\":%ld,\"error\":\"%s\"}\n",
          lspawn::compat::torch_version().c_str(), w, mode.name.c_str(), threads, pair_ids ? "true" : "false", r.wall_s,
          r.requests, r.gets, r.multi_gets, r.error.empty() ? "" : "failed");
      std::fflush(stdout);
    }
  }
  return 0;
}
