// A worker for the runtime tests, started by exec with the env contract set by the test.
//   test_worker rendezvous    rendezvous(); prints "peers <n> pids <p0> <p1> ..."; exit 0,
//                             3 on RendezvousTimeout, 4 on another RendezvousError
//   test_worker collectives   init_process_group(); checks all_reduce (sum, mean, min, max,
//                             product), broadcast, all_gather, barrier; exit 0, 5 on a wrong value
//   test_worker listeners     init_process_group(); prints "listen <addr>:<port>" for every TCP
//                             socket this process listens on and "gloo record of rank R
//                             pointing to <addr>:<port>..." for what each rank's gloo listened
//                             on, then a barrier; exit 0
//   test_worker gloo-strangers  init_process_group(); writes its pid and the ports it listens on
//                             to $LSPAWN_TEST_SYNC_DIR/ready-<rank> (tests/runtime/gloo_strangers.hpp);
//                             the last rank waits for go-1 there; all build a second gloo process
//                             group and all_reduce on it; touch connected-<rank>, wait for go-2,
//                             all_reduce on both, then on a third group (lspawn::Group, gloo);
//                             prints "gloo-strangers ok" and the guard's counts
//                             (runtime/gloo_guard.hpp); exit 0, 5 on a wrong value
//   (LSPAWN_TEST_ABSENT_RANK=R: rank R never arrives, whatever the mode)
//   test_worker stranger      not a rank: writes forged plain records into the job's store
//   (LSPAWN_TEST_DELAY_RANKS_MS=N: ranks other than 0 start N ms late)
//   test_worker sigpipe       init_process_group() (world size 1), then writev(2) to a socket
//                             whose peer has closed: prints "writev: <errno name>"; exit 0
//                             (LSPAWN_TEST_OWN_SIGPIPE=1: installs a SIGPIPE handler first, and
//                             prints "own handler kept, called <n>")
//   test_worker throw         run_main() around a throw of std::runtime_error
//   test_worker throw-custom  run_main() around a throw of lspawn_test::CustomError
//   test_worker throw-c10     run_main() around a TORCH_CHECK failure (c10::Error)
//   test_worker terminate     install_error_handler(); main throws with no handler (terminate)
//   test_worker terminate-thread  same from a std::thread (stack unwound to its noexcept frame)
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <c10/util/Exception.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "collectives/group.hpp"
#include "collectives/ops.hpp"
#include "runtime/error_report.hpp"
#include "runtime/gloo_guard.hpp"
#include "runtime/process_group.hpp"
#include "runtime/record_auth.hpp"
#include "runtime/torch_compat.hpp"
#include "runtime/rendezvous.hpp"
#include "support/env.hpp"
#include "tests/runtime/gloo_strangers.hpp"
#include "tests/runtime/sockets.hpp"

namespace lspawn_test {
struct CustomError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace lspawn_test

// Outside any anonymous namespace (and the binary linked with -rdynamic) so that backtrace
// symbols name them.
extern "C" __attribute__((noinline)) void lspawn_test_throw_uncaught() {
  throw std::runtime_error("uncaught in main, rank " + std::string(std::getenv("RANK") ? std::getenv("RANK") : "?"));
}

extern "C" __attribute__((noinline)) void lspawn_test_throw_runtime_error() {
  throw std::runtime_error("boom from rank " + std::string(std::getenv("RANK") ? std::getenv("RANK") : "?"));
}

extern "C" __attribute__((noinline)) void lspawn_test_throw_in_thread() {
  throw std::runtime_error("thrown in a thread of rank " +
                           std::string(std::getenv("RANK") ? std::getenv("RANK") : "?"));
}

namespace {

int do_rendezvous() {
  const auto env = lspawn::WorkerEnv::from_environment();
  try {
    auto rdzv = lspawn::rendezvous(env);
    std::printf("rank %d: port %u peers %zu pids", env.rank, rdzv.port, rdzv.peers.size());
    for (const auto& p : rdzv.peers) std::printf(" %lld", static_cast<long long>(p.pid));
    std::printf("\n");
    return 0;
  } catch (const lspawn::RendezvousTimeout& e) {
    std::printf("RendezvousTimeout: %s\n", e.what());
    return 3;
  } catch (const lspawn::RendezvousError& e) {
    std::printf("RendezvousError: %s\n", e.what());
    return 4;
  }
}

bool close_to(const at::Tensor& t, double want) { return t.allclose(at::full_like(t, want)); }

int do_collectives() {
  auto w = lspawn::init_process_group();
  const int r = w.rank(), n = w.size();
  int bad = 0;
  auto check = [&](const char* what, const at::Tensor& got, double want) {
    if (!close_to(got, want)) {
      std::printf("rank %d/%d: %s: got %s want %g\n", r, n, what, got.toString().c_str(), want);
      std::printf("values: %f\n", got.flatten()[0].item<double>());
      ++bad;
    }
  };
  auto allreduce = [&](c10d::ReduceOp op) {
    std::vector<at::Tensor> ts{at::full({4}, double(r + 1), at::kDouble)};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    w.pg->allreduce(ts, o)->wait();
    return ts[0];
  };
  double fact = 1;
  for (int i = 1; i <= n; ++i) fact *= i;
  check("allreduce sum", allreduce(c10d::ReduceOp::SUM), n * (n + 1) / 2.0);
  check("allreduce mean", allreduce(c10d::ReduceOp::SUM) / n, (n + 1) / 2.0);
  check("allreduce min", allreduce(c10d::ReduceOp::MIN), 1);
  check("allreduce max", allreduce(c10d::ReduceOp::MAX), n);
  check("allreduce product", allreduce(c10d::ReduceOp::PRODUCT), fact);

  std::vector<at::Tensor> b{at::full({3}, r == n - 1 ? 42.0 : -1.0, at::kFloat)};
  c10d::BroadcastOptions bo;
  bo.rootRank = n - 1;
  w.pg->broadcast(b, bo)->wait();
  check("broadcast from last rank", b[0], 42);

  std::vector<at::Tensor> in{at::full({2}, double(10 * r), at::kFloat)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < n; ++i) out[0].push_back(at::empty({2}, at::kFloat));
  w.pg->allgather(out, in)->wait();
  for (int i = 0; i < n; ++i) check("all_gather", out[0][i], 10.0 * i);

  w.pg->barrier()->wait();
  std::printf("rank %d/%d: collectives %s\n", r, n, bad ? "WRONG" : "ok");
  return bad ? 5 : 0;
}

// A file of the gloo-strangers job's sync directory ($LSPAWN_TEST_SYNC_DIR).
std::string sync_file(const std::string& name) { return std::string(std::getenv("LSPAWN_TEST_SYNC_DIR")) + "/" + name; }

// Waits (at most 60 s) for sync_file(name); false when it never came.
bool wait_for_file(const std::string& name) {
  return lspawn::test::wait_file(sync_file(name), std::chrono::seconds(60));
}

// A store that holds back the publication of gloo's pair addresses (1.13's connectFullMesh
// writes them under the rank's number, after every rank's host name) until go-1: the other
// ranks have made their pairs and wait, each pair listening (gloo of 2022 listens per pair only
// then; the gloo of 2.x listens per device, from its creation).
class HoldStore final : public lspawn::compat::ForwardingStore<HoldStore> {
 public:
  explicit HoldStore(c10::intrusive_ptr<c10d::Store> store) : ForwardingStore(std::move(store)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    const std::string last = key.substr(key.rfind('/') + 1);
    if (!last.empty() && last.find_first_not_of("0123456789") == std::string::npos) (void)wait_for_file("go-1");
    inner_->set(key, value);
  }
};

int do_gloo_strangers() {
  auto w = lspawn::init_process_group();
  const int r = w.rank(), n = w.size();
  // What this rank listens on before the second group: the store (rank 0), the world's gloo.
  lspawn::test::write_ready(sync_file("ready-" + std::to_string(r)));
  // A gloo process group made as lspawn makes its own (runtime/process_group.cpp), so that the
  // last rank can hold it back: the others wait in gloo's connectFullMesh, listening.
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>("late", w.store);
  if (r == n - 1) store = c10::make_intrusive<HoldStore>(store);
  c10::intrusive_ptr<c10d::ProcessGroup> late;
  {
    lspawn::GlooSetupScope guarded;
    auto opts = c10d::ProcessGroupGloo::Options::create(w.timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    late = lspawn::compat::wrap_backend(c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, n, opts), store, "gloo");
  }
  int bad = 0;
  auto sum_on = [&](c10d::ProcessGroup& pg) {
    std::vector<at::Tensor> ts{at::full({4}, double(r + 1), at::kDouble)};
    pg.allreduce(ts)->wait();
    if (!close_to(ts[0], n * (n + 1) / 2.0)) ++bad;
  };
  sum_on(*late);
  lspawn::test::touch(sync_file("connected-" + std::to_string(r)));
  if (!wait_for_file("go-2")) return 6;
  sum_on(*late);
  sum_on(*w.pg);
  // And a group of lspawn's collectives (collectives/group.cpp), on gloo.
  lspawn::GroupOptions o;
  o.backend = lspawn::Backend::Gloo;
  o.name = "third";
  auto g = lspawn::Group::from_world(w, o);
  at::Tensor t = at::full({4}, double(r + 1), at::kDouble);
  lspawn::all_reduce(*g, t, lspawn::ReduceOp::Sum);
  if (!close_to(t, n * (n + 1) / 2.0)) ++bad;
  std::printf(
      "rank %d/%d: gloo-strangers %s; guard active %d, tokens sent %llu, admitted %llu, refused %llu, stand-ins %llu\n",
      r, n, bad ? "WRONG" : "ok", lspawn::GlooGuard::active() ? 1 : 0,
      static_cast<unsigned long long>(lspawn::GlooGuard::sent()),
      static_cast<unsigned long long>(lspawn::GlooGuard::admitted()),
      static_cast<unsigned long long>(lspawn::GlooGuard::refused()),
      static_cast<unsigned long long>(lspawn::GlooGuard::stand_ins()));
  return bad ? 5 : 0;
}

int do_listeners() {
  auto w = lspawn::init_process_group();
  for (const auto& l : lspawn::test::tcp_listeners(::getpid())) {
    std::printf("rank %d: listen %s:%u\n", w.rank(), l.addr.c_str(), l.port);
  }
  // gloo (2022) listens per pair only while connecting; what it listened on is what each rank
  // published for its peers: read it back (through the authenticated store when there is one).
  for (int r = 0; r < w.size(); ++r) {
    const auto v = w.store->get("gloo/0/" + std::to_string(r));
    std::printf("rank %d: gloo record of rank %d %s\n", w.rank(), r, lspawn::describe_foreign_record(v).c_str());
  }
  std::fflush(stdout);
  w.pg->barrier()->wait();
  return 0;
}

// Not a rank: a client of the job's store at MASTER_ADDR:MASTER_PORT without the secret, writing
// what would make it rank 1 and point gloo's rank 1 at 127.0.0.1:9 under the plain protocol keys
// of run TORCHELASTIC_RUN_ID. Prints "stranger wrote" and exits 0.
int do_stranger() {
  const std::string host = std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR") : "127.0.0.1";
  const auto port = static_cast<uint16_t>(lspawn::test::env_int("MASTER_PORT", 0));
  const std::string prefix = std::string("lspawn/") +
                             (std::getenv("TORCHELASTIC_RUN_ID") ? std::getenv("TORCHELASTIC_RUN_ID") : "none") + "/0/";
  auto store = lspawn::connect_store(host, port, std::chrono::seconds(20));
  const std::string rec = "evil-host\n4242";
  store->set(prefix + "rdzv/rank/1", std::vector<uint8_t>(rec.begin(), rec.end()));
  std::vector<uint8_t> gloo(sizeof(sockaddr_storage) + 8, 0);
  sockaddr_in evil{};
  evil.sin_family = AF_INET;
  evil.sin_port = htons(9);
  evil.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::memcpy(gloo.data(), &evil, sizeof evil);
  store->set(prefix + "gloo/0/1", gloo);
  std::printf("stranger wrote\n");
  return 0;
}

// Unwinds slowly, as a process group's destructor does: says "unwinding", then waits for "go".
struct SlowUnwind {
  ~SlowUnwind() {
    lspawn::test::touch(sync_file("unwinding"));
    wait_for_file("go");
  }
};

// What gloo does when the peer has gone (it writes with writev): a peer's death must be an
// error, not a signal that kills this rank without a word.
volatile sig_atomic_t g_own_sigpipe_calls = 0;
void own_sigpipe_handler(int) { g_own_sigpipe_calls = g_own_sigpipe_calls + 1; }

int do_sigpipe() {
  const bool own = std::getenv("LSPAWN_TEST_OWN_SIGPIPE") != nullptr;
  // Whatever the test's parent ignored: a program starts with SIGPIPE at its default.
  ::signal(SIGPIPE, own ? own_sigpipe_handler : SIG_DFL);
  lspawn::World w = lspawn::init_process_group();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 6;
  ::close(sv[1]);
  char byte = 'x';
  struct iovec iov {
    &byte, 1
  };
  const ssize_t n = ::writev(sv[0], &iov, 1);
  const int err = errno;
  std::printf("writev: %s\n", n < 0 && err == EPIPE ? "EPIPE" : n < 0 ? std::strerror(err) : "wrote");
  if (own) {
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    std::printf("own handler %s, called %d\n", now.sa_handler == own_sigpipe_handler ? "kept" : "replaced",
                static_cast<int>(g_own_sigpipe_calls));
  }
  std::fflush(stdout);
  ::close(sv[0]);
  return 0;
}

int worker_main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "stranger") return do_stranger();
  // LSPAWN_TEST_DELAY_RANKS_MS=N: every rank but 0 starts N ms late (a stranger's head start).
  if (const char* d = std::getenv("LSPAWN_TEST_DELAY_RANKS_MS");
      d != nullptr && std::getenv("RANK") != nullptr && std::strcmp(std::getenv("RANK"), "0") != 0) {
    ::usleep(static_cast<useconds_t>(std::atoi(d)) * 1000);
  }
  // LSPAWN_TEST_ABSENT_RANK=R: rank R never arrives (sleeps until killed), in every mode.
  if (const char* absent = std::getenv("LSPAWN_TEST_ABSENT_RANK");
      absent != nullptr && std::getenv("RANK") != nullptr && std::strcmp(absent, std::getenv("RANK")) == 0) {
    for (;;) ::pause();
  }
  if (mode == "rendezvous") return do_rendezvous();
  if (mode == "collectives") return do_collectives();
  if (mode == "gloo-strangers") return do_gloo_strangers();
  if (mode == "listeners") return do_listeners();
  if (mode == "sigpipe") return do_sigpipe();
  if (mode == "throw") lspawn_test_throw_runtime_error();
  if (mode == "throw-slow-unwind") {
    SlowUnwind slow;
    lspawn_test_throw_runtime_error();
  }
  if (mode == "wait-for-term") {
    lspawn::test::touch(sync_file("waiting"));
    for (;;) ::pause();
  }
  if (mode == "throw-custom") throw lspawn_test::CustomError("custom failure");
  if (mode == "throw-c10") TORCH_CHECK(false, "c10 check failed on purpose");
  if (mode == "terminate-thread") {
    std::thread t(lspawn_test_throw_in_thread);
    t.join();
    return 0;
  }
  std::fprintf(stderr, "test_worker: unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "terminate") == 0) {
    // No handler anywhere: std::terminate runs before any unwinding.
    lspawn::install_error_handler();
    lspawn_test_throw_uncaught();
    return 0;
  }
  return lspawn::run_main(argc, argv, worker_main);
}
