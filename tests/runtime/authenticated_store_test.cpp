// AuthenticatedStore and GlooConnectStore over a real TCPStore (host_store, port 0): the extended
// store API (multiGet, multiSet, append, hasExtendedApi; LibTorch 2.x) keeps each wrapper's
// meaning, and a real ProcessGroupGloo connects through lspawn's store chain with one multiGet per
// 128 peers where gloo's batched path is on (GLOO_ENABLE_STORE_V2_API=1). Ranks are threads here:
// what is tested is which store calls gloo makes, not processes.
#include <dlfcn.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "runtime/authenticated_store.hpp"
#include "runtime/gloo_connect_store.hpp"
#include "runtime/record_auth.hpp"
#include "runtime/rendezvous.hpp"
#include "runtime/store_extended_api.hpp"
#include "runtime/torch_compat.hpp"
#include "support/counting_store.hpp"  // CountingStore: what reaches each rank's TCPStore client

#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using lspawn::test::CountingStore;
using lspawn::test::StoreCounts;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";
const std::string kOtherSecret = "fedcba9876543210fedcba9876543210";

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Every report an AuthenticatedStore makes, for the checks.
struct Reports {
  std::mutex m;
  std::vector<std::string> lines;
  lspawn::AuthenticatedStore::Report sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(m);
      lines.push_back(line);
    };
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(m);
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
};

// A TCPStore server and clients of it, each with `timeout`.
struct Server {
  explicit Server(std::chrono::milliseconds timeout = 10s) : hosted(lspawn::host_store("127.0.0.1", 0, timeout)) {}
  c10::intrusive_ptr<c10d::TCPStore> client(std::chrono::milliseconds timeout = 10s) {
    auto c = lspawn::connect_store("127.0.0.1", hosted->public_port(), 10s);
    c->setTimeout(timeout);
    return c;
  }
  c10::intrusive_ptr<lspawn::HostedStore> hosted;
};

}  // namespace

TEST_CASE("authenticated store: multiGet returns what set and multiSet stored, sealed in the store",
          "[unit][security][store]") {
  Server server;
  auto raw = server.client();
  Reports reports;
  lspawn::AuthenticatedStore auth(server.client(), lspawn::RecordAuth(kSecret), "rank 0/2", reports.sink());
  auth.set("a", bytes("alpha"));
  auth.multiSet({"b", "c"}, {bytes("beta"), bytes("")});
  CHECK(auth.multiGet({"c", "a", "b"}) == std::vector<std::vector<uint8_t>>{bytes(""), bytes("alpha"), bytes("beta")});
  CHECK(auth.get("b") == bytes("beta"));
  CHECK(auth.multiGet({}).empty());

  // What multiSet wrote is a sealed record under the secret-derived name, nothing under the plain one.
  const lspawn::RecordAuth ra(kSecret);
  CHECK_FALSE(raw->check({"b"}));
  const auto sealed = raw->get(ra.key_name("b"));
  CHECK(sealed != bytes("beta"));
  CHECK(ra.open("b", sealed) == bytes("beta"));
  CHECK_THROWS_AS(auth.multiSet({"x"}, {}), std::invalid_argument);
  CHECK(auth.refused() == 0);
  CHECK(reports.all().empty());
}

TEST_CASE("authenticated store: multiGet waits for a key set later, as get() does", "[unit][store]") {
  Server server;
  lspawn::AuthenticatedStore reader(server.client(), lspawn::RecordAuth(kSecret), "rank 0/2");
  lspawn::AuthenticatedStore writer(server.client(), lspawn::RecordAuth(kSecret), "rank 1/2");
  writer.set("early", bytes("1"));
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    writer.set("late", bytes("2"));
  });
  const auto values = reader.multiGet({"early", "late"});
  late.join();
  CHECK(values == std::vector<std::vector<uint8_t>>{bytes("1"), bytes("2")});
}

TEST_CASE("authenticated store: multiGet refuses a tampered record as get() does", "[unit][security][store]") {
  Server server;
  auto raw = server.client();
  const lspawn::RecordAuth ra(kSecret);
  const lspawn::RecordAuth forger(kOtherSecret);
  Reports reports;
  lspawn::AuthenticatedStore auth(server.client(1s), ra, "rank 0/2", reports.sink());
  auth.set("good", bytes("fine"));

  SECTION("the legitimate record arrives later: read, the forged one reported once") {
    raw->set(ra.key_name("addr"), forger.seal("addr", bytes("10.9.9.9:666")));
    REQUIRE(raw->check({ra.key_name("addr")}));  // the set has landed (TCPStore's set has no reply)
    std::thread writer([&] {
      std::this_thread::sleep_for(300ms);
      lspawn::AuthenticatedStore(server.client(), ra, "rank 1/2").set("addr", bytes("10.0.0.1:1234"));
    });
    const auto values = auth.multiGet({"good", "addr"});
    writer.join();
    CHECK(values == std::vector<std::vector<uint8_t>>{bytes("fine"), bytes("10.0.0.1:1234")});
    CHECK(auth.refused() == 1);
    CHECK_THAT(reports.all(), Contains("rank 0/2: refused a store record for 'addr'") &&
                                  Contains("bad MAC (not written with this job's secret)"));
  }
  SECTION("it never arrives: multiGet throws what get() throws") {
    raw->set(ra.key_name("addr"), forger.seal("addr", bytes("10.9.9.9:666")));
    REQUIRE(raw->check({ra.key_name("addr")}));  // the set has landed (TCPStore's set has no reply)
    std::string from_get, from_multi_get;
    try {
      auth.get("addr");
    } catch (const std::runtime_error& e) {
      from_get = e.what();
    }
    try {
      auth.multiGet({"good", "addr"});
    } catch (const std::runtime_error& e) {
      from_multi_get = e.what();
    }
    CHECK_THAT(from_get, Contains("no record for 'addr' signed with this job's secret within 1000 ms"));
    CHECK(from_multi_get == from_get);
    CHECK(auth.refused() == 1);  // the same record, reported once
  }
  SECTION("a record without a seal (a plain value under the name) is refused too") {
    raw->set(ra.key_name("addr"), bytes("plain"));
    REQUIRE(raw->check({ra.key_name("addr")}));  // the set has landed (TCPStore's set has no reply)
    CHECK_THROWS_WITH(auth.multiGet({"addr"}), Contains("no record for 'addr'"));
    CHECK(auth.refused() == 1);
  }
}

TEST_CASE("authenticated store: while watching, multiGet reports records under the plain names",
          "[unit][security][store]") {
  Server server;
  auto raw = server.client();
  Reports reports;
  lspawn::AuthenticatedStore auth(server.client(), lspawn::RecordAuth(kSecret), "rank 0/2", reports.sink());
  auth.watch_strangers(true);
  auth.set("k", bytes("v"));
  raw->set("k", bytes("10.6.6.6"));
  REQUIRE(raw->check({"k"}));  // the set has landed (TCPStore's set has no reply)
  CHECK(auth.multiGet({"k"}) == std::vector<std::vector<uint8_t>>{bytes("v")});
  CHECK(auth.refused() == 1);
  CHECK_THAT(reports.all(), Contains("'k'") && Contains("not signed with this job's secret"));
}

TEST_CASE("authenticated store: append adds to the sealed record, a forged one is refused", "[unit][security][store]") {
  if constexpr (!lspawn::compat::kStoreHasExtendedApi) {
    SUCCEED("this LibTorch's c10d::Store has no append");
    return;
  }
  Server server;
  auto raw = server.client();
  const lspawn::RecordAuth ra(kSecret);
  Reports reports;
  lspawn::AuthenticatedStore auth(server.client(), ra, "rank 0/2", reports.sink());
  auth.append("log", bytes("a"));
  auth.append("log", bytes("bc"));
  CHECK(auth.get("log") == bytes("abc"));
  CHECK(ra.open("log", raw->get(ra.key_name("log"))) == bytes("abc"));

  // Concurrent appends of distinct bytes all land.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      lspawn::AuthenticatedStore mine(server.client(), ra, "rank " + std::to_string(t) + "/4");
      for (int i = 0; i < 5; ++i) mine.append("many", bytes(std::string(1, static_cast<char>('a' + t))));
    });
  }
  for (auto& t : threads) t.join();
  CHECK(auth.get("many").size() == 20);

  raw->set(ra.key_name("forged"), lspawn::RecordAuth(kOtherSecret).seal("forged", bytes("evil")));
  REQUIRE(raw->check({ra.key_name("forged")}));  // the set has landed (TCPStore's set has no reply)
  CHECK_THROWS_WITH(auth.append("forged", bytes("x")), Contains("cannot append to 'forged'"));
  CHECK(auth.refused() == 1);
}

TEST_CASE("store wrappers: hasExtendedApi is the TCPStore's on 2.x, false (no such member in c10d) on 1.13",
          "[unit][store]") {
  Server server;
  c10::intrusive_ptr<c10d::Store> auth =
      c10::make_intrusive<lspawn::AuthenticatedStore>(server.client(), lspawn::RecordAuth(kSecret), "rank 0/1");
  // The chain init_process_group builds: run prefix, backend prefix, GlooConnectStore.
  auto run = c10::make_intrusive<c10d::PrefixStore>("lspawn/run/0", auth);
  auto gloo = c10::make_intrusive<lspawn::GlooConnectStore>(c10::make_intrusive<c10d::PrefixStore>("gloo", run));
  CHECK(lspawn::compat::has_extended_api(*auth) == lspawn::compat::kStoreHasExtendedApi);
  CHECK(gloo->hasExtendedApi() == lspawn::compat::kStoreHasExtendedApi);
  CHECK(lspawn::compat::has_extended_api<c10d::Store>(*gloo) == lspawn::compat::kStoreHasExtendedApi);
  if constexpr (lspawn::compat::kStoreHasExtendedApi) {
    CHECK(lspawn::compat::has_extended_api(*server.client()));  // TCPStore's own
  }
  // Through the chain, batched or not, the values come back.
  gloo->set("0", bytes("zero"));
  lspawn::compat::multi_set<c10d::Store>(*gloo, {"1", "2"}, {bytes("one"), bytes("two")});
  CHECK(lspawn::compat::multi_get<c10d::Store>(*gloo, {"2", "0", "1"}) ==
        std::vector<std::vector<uint8_t>>{bytes("two"), bytes("zero"), bytes("one")});
}

namespace {

// What W ranks' store clients saw while W real ProcessGroupGloo connected their full mesh over
// lspawn's chain: TCPStore client (counted) <- AuthenticatedStore (watching) <- PrefixStore (run)
// <- PrefixStore ("gloo") <- GlooConnectStore.
struct MeshRun {
  StoreCounts counts;
  float sum = 0;
};

// Whether the gloo inside the loaded LibTorch has the batched connect (gloo PR 408): it reads
// GLOO_ENABLE_STORE_V2_API, so that name is in the library that holds ProcessGroupGloo. 2.15's
// has it, 2.4.1's does not; the headers cannot tell (gloo's own are not shipped).
bool gloo_has_batched_connect() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&c10d::ProcessGroupGloo::createDeviceForHostname), &info) == 0 ||
      !info.dli_fname) {
    return false;
  }
  const int fd = ::open(info.dli_fname, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool found = false;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      static const char kName[] = "GLOO_ENABLE_STORE_V2_API";
      found = ::memmem(map, static_cast<size_t>(st.st_size), kName, sizeof kName - 1) != nullptr;
      ::munmap(map, static_cast<size_t>(st.st_size));
    }
  }
  ::close(fd);
  return found;
}

void connect_mesh(int world, bool gloo_v2, MeshRun& out) {
  struct Env {
    explicit Env(bool on) {
      if (on)
        ::setenv("GLOO_ENABLE_STORE_V2_API", "1", 1);
      else
        ::unsetenv("GLOO_ENABLE_STORE_V2_API");
    }
    ~Env() { ::unsetenv("GLOO_ENABLE_STORE_V2_API"); }
  } env(gloo_v2);  // set before any rank's thread starts (getenv is not synchronised with setenv)
  Server server(30s);
  auto counts = std::shared_ptr<StoreCounts>(&out.counts, [](StoreCounts*) {});
  std::vector<float> sums(world, 0);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto counted = c10::make_intrusive<CountingStore>(server.client(30s), counts);
        auto auth = c10::make_intrusive<lspawn::AuthenticatedStore>(
            counted, lspawn::RecordAuth(kSecret), "rank " + std::to_string(r) + "/" + std::to_string(world));
        auth->watch_strangers(true);
        auto run = c10::make_intrusive<c10d::PrefixStore>("lspawn/mesh/0", auth);
        c10::intrusive_ptr<c10d::Store> store =
            c10::make_intrusive<lspawn::GlooConnectStore>(c10::make_intrusive<c10d::PrefixStore>("gloo", run));
        auto opts = c10d::ProcessGroupGloo::Options::create(30s);
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, world, opts);
        std::vector<at::Tensor> t{at::ones({4})};
        pg->allreduce(t)->wait();
        sums[r] = t[0].sum().item<float>();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
  }
  out.sum = sums[0];
}

}  // namespace

TEST_CASE("gloo over lspawn's store chain: the full-mesh connect reads with multiGet where gloo can",
          "[store][process_group]") {
  constexpr int kWorld = 4;
  MeshRun sequential, batched;
  connect_mesh(kWorld, false, sequential);
  connect_mesh(kWorld, true, batched);
  INFO("sequential: get " << sequential.counts.get << " multiGet " << sequential.counts.multi_get << " wait "
                          << sequential.counts.wait << " check " << sequential.counts.check);
  INFO("batched: get " << batched.counts.get << " multiGet " << batched.counts.multi_get << " ("
                       << batched.counts.multi_get_keys << " keys) wait " << batched.counts.wait << " check "
                       << batched.counts.check);
  CHECK(sequential.sum == 4.0f * kWorld);
  CHECK(batched.sum == 4.0f * kWorld);
  // Without GLOO_ENABLE_STORE_V2_API gloo reads key by key (each rank the others' address
  // records; newer gloo its own too).
  CHECK(sequential.counts.multi_get == 0);
  CHECK(sequential.counts.get >= kWorld * (kWorld - 1));
  if (lspawn::compat::kStoreHasExtendedApi && gloo_has_batched_connect()) {
    // 2.15: one multiGet of the W address records per rank (W <= 128), no get() of them.
    CHECK(batched.counts.multi_get == kWorld);
    CHECK(batched.counts.multi_get_keys == kWorld * kWorld);
    CHECK(batched.counts.get <= sequential.counts.get - kWorld * kWorld);
  } else {
    // 1.13, 2.4.1: their gloo has no batched connect (1.13's store has no extended API either);
    // nothing changes.
    CHECK(batched.counts.multi_get == 0);
  }
}
