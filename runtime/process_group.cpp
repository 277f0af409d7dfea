#include "runtime/process_group.hpp"
#include "runtime/cuda_device.hpp"
#include "runtime/torch_compat.hpp"

#include "status/phase.hpp"
#include "status/recorder.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <system_error>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "runtime/authenticated_store.hpp"
#include "runtime/gloo_connect_store.hpp"
#include "runtime/gloo_loop_ticker.hpp"
#include "runtime/rendezvous.hpp"
#include "runtime/recorded_backend.hpp"
#include "runtime/gloo_guard.hpp"
#include "runtime/throw_trace.hpp"
#include "supervisor/worker_failure.hpp"
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/loop.h>
#ifdef LSPAWN_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace lspawn {
namespace {

// The restart policy's "started" marker (status/phase.hpp), written when a worker that links this
// file starts: a failure before init_process_group() is then known to come before the rendezvous.
[[maybe_unused]] const bool kStartMarked = [] {
  status::mark_phase("started");
  return true;
}();

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string getenv_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

// The local address the kernel would use to reach host:port (a UDP connect sends nothing).
std::string local_address_towards(const std::string& host, uint16_t port, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port == 0 ? 1 : port);
  const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) {
    throw ProcessGroupError(who + ": cannot resolve MASTER_ADDR='" + host +
                            "' to choose the gloo interface: getaddrinfo: " + ::gai_strerror(gai) +
                            " (set LSPAWN_GLOO_HOST or GLOO_SOCKET_IFNAME)");
  }
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::string("connect: ") + std::strerror(errno);
    } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      why = std::string("getsockname: ") + std::strerror(errno);
    } else {
      char buf[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      ::inet_ntop(local.ss_family, addr, buf, sizeof buf);
      ::close(fd);
      ::freeaddrinfo(res);
      return buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  throw ProcessGroupError(who + ": no route to MASTER_ADDR='" + host + "' to choose the gloo interface: " + why +
                          " (set LSPAWN_GLOO_HOST or GLOO_SOCKET_IFNAME)");
}

// `chosen`: set to the address the device binds to ("" for an interface named by GLOO_SOCKET_IFNAME).
std::shared_ptr<::gloo::transport::Device> gloo_device(const InitOptions& options, const WorkerEnv& env,
                                                       const std::string& who, std::string& chosen) {
  std::string host = options.interface_host;
  if (host.empty()) host = getenv_or("LSPAWN_GLOO_HOST", "");
  try {
    if (host.empty()) {
      const std::string ifname = getenv_or("GLOO_SOCKET_IFNAME", "");
      if (!ifname.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
      host = env.group_world_size == 1 ? "127.0.0.1" : local_address_towards(env.master_addr, env.master_port, who);
    }
    chosen = host;
    return c10d::ProcessGroupGloo::createDeviceForHostname(host);
  } catch (const ProcessGroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProcessGroupError(who + ": cannot create the gloo device for '" + host + "': " + e.what());
  }
}

// ProcessGroupGloo whose devices' loops tick fast (GlooLoopTicker) while it connects, until
// pause_ticking() (init_process_group: after its first barrier), and again while it is destroyed;
// in between (the whole training run) they are left as gloo made them.
// TickingSlot is the first base: it is constructed before ProcessGroupGloo (so the tickers run
// during its constructor, which connects the full mesh) and destroyed after it (so they run
// during its destructor, which closes every pair, and while the devices go).
struct TickingSlot {
  // Without a ticker (no timerfd left, say) gloo only runs at its own pace: not an error.
  explicit TickingSlot(const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices) noexcept {
    try {
      for (const auto& d : devices) tickers.push_back(std::make_unique<GlooLoopTicker>(d));
    } catch (const std::exception&) {}
  }
  void set_ticking(bool on) noexcept {
    for (auto& t : tickers) {
      try {
        on ? t->resume() : t->pause();
      } catch (const std::exception&) {}
    }
  }
  // Destroyed after ProcessGroupGloo: the tickers then hold the last references to the devices.
  std::vector<std::unique_ptr<GlooLoopTicker>> tickers;
};

class TickingProcessGroupGloo : private TickingSlot, public c10d::ProcessGroupGloo {
 public:
  TickingProcessGroupGloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                          c10::intrusive_ptr<Options> options)
      : TickingSlot(options->devices), c10d::ProcessGroupGloo(store, rank, size, options) {}
  ~TickingProcessGroupGloo() override { set_ticking(true); }
  void pause_ticking() { set_ticking(false); }
};

}  // namespace

struct GlooLoopTicker::Impl final : ::gloo::transport::tcp::Handler {
  std::shared_ptr<::gloo::transport::tcp::Device> device;
  int fd = -1;
  itimerspec armed{};  // the period, for resume()
  void set_timer(const itimerspec& its) {
    if (::timerfd_settime(fd, 0, &its, nullptr) != 0) {
      throw std::system_error(errno, std::generic_category(), "timerfd_settime (gloo loop ticker)");
    }
  }
  std::atomic<uint64_t> ticks{0};
  // Runs on the loop thread: drain the timer (level-triggered, so it must be read).
  void handleEvents(int) override {
    uint64_t expirations = 0;
    if (::read(fd, &expirations, sizeof expirations) == static_cast<ssize_t>(sizeof expirations)) {
      ticks.fetch_add(expirations, std::memory_order_relaxed);
    }
  }
};

GlooLoopTicker::GlooLoopTicker(std::shared_ptr<::gloo::transport::Device> device, std::chrono::microseconds period) {
  if (!compat::kGlooLoopTicker) return;  // LibTorch 2.x's own gloo: left alone (torch_compat.hpp)
  auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(device);
  if (!tcp) return;
  auto impl = std::make_unique<Impl>();
  impl->device = std::move(tcp);
  impl->fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (impl->fd < 0) throw std::system_error(errno, std::generic_category(), "timerfd_create (gloo loop ticker)");
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(period, std::chrono::microseconds(1)));
  impl->armed.it_interval.tv_sec = static_cast<time_t>(ns.count() / 1'000'000'000);
  impl->armed.it_interval.tv_nsec = static_cast<long>(ns.count() % 1'000'000'000);
  impl->armed.it_value = impl->armed.it_interval;
  try {
    impl->set_timer(impl->armed);
    impl->device->registerDescriptor(impl->fd, EPOLLIN, impl.get());
  } catch (...) {
    ::close(impl->fd);
    throw;
  }
  impl_ = std::move(impl);
}

void GlooLoopTicker::pause() {
  if (impl_) impl_->set_timer(itimerspec{});
}

void GlooLoopTicker::resume() {
  if (impl_) impl_->set_timer(impl_->armed);
}

GlooLoopTicker::~GlooLoopTicker() {
  if (!impl_) return;
  if (impl_->device.use_count() == 1) {
    // The last reference: the device (and its loop, which only the device holds) goes now.
    // Loop::~Loop joins the loop thread, which our armed timer wakes within one period; after
    // that nothing calls the handler.
    try {
      resume();
    } catch (const std::exception&) {
      // Only slower: the loop thread then ends on gloo's own 10 ms timeout.
    }
    impl_->device.reset();
  } else {
    try {
      // The device lives on: take the timer off its loop. This waits for the loop's next tick,
      // which the timer no longer causes (up to gloo's 10 ms); after it the loop never calls
      // the handler again.
      impl_->device->unregisterDescriptor(impl_->fd, impl_.get());
    } catch (...) {
      // epoll_ctl failed: the fd was never or is no longer registered.
    }
  }
  ::close(impl_->fd);
}

uint64_t GlooLoopTicker::ticks() const { return impl_ ? impl_->ticks.load(std::memory_order_relaxed) : 0; }

bool have_nccl() {
#ifdef LSPAWN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

World init_process_group(const InitOptions& options) {
  status::mark_phase("rendezvous");  // from here on a failure is not the same in every attempt
  const auto t0 = Clock::now();
  World w;
  w.env = options.env ? *options.env : WorkerEnv::from_environment();
  // The rank's status record and stack-dump handler exist from here on, so a rank that hangs
  // before its first group is still reported with its stack (docs/hang-diagnosis.md).
  status::Recorder::process();
  // A peer's death is an error from the collective, not a SIGPIPE; spawn()'s worker dates its
  // failure by the throw, as record() does (supervisor/worker_failure.hpp).
  ignore_sigpipe_if_default();
  set_throw_clock(&detail::throw_site_time_us);
  const std::string who = "rank " + std::to_string(w.env.rank) + "/" + std::to_string(w.env.world_size);

  w.backend = !options.backend.empty() ? options.backend : getenv_or("LSPAWN_BACKEND", "gloo");
  // shm and auto choose the collectives' transport (collectives/group.hpp); the world's process
  // group under them, which carries what shm does not and everything across nodes, is gloo.
  if (w.backend == "shm" || w.backend == "auto") w.backend = "gloo";
  if (w.backend != "gloo" && w.backend != "nccl") {
    throw ProcessGroupError(who + ": unknown backend '" + w.backend + "' (from " +
                            (options.backend.empty() ? "LSPAWN_BACKEND" : "InitOptions::backend") +
                            "): expected gloo, nccl, shm or auto");
  }
  if (w.backend == "nccl" && !have_nccl()) {
    throw ProcessGroupError(who +
                            ": backend 'nccl' requested but lspawn was built without NCCL "
                            "(reconfigure with -DLSPAWN_WITH_NCCL=ON and a CUDA LibTorch)");
  }
  w.timeout = options.timeout.count() > 0
                  ? options.timeout
                  : duration_from_environment("LSPAWN_PG_TIMEOUT").value_or(kDefaultCollectiveTimeout);
  if (w.timeout.count() <= 0) w.timeout = kDefaultCollectiveTimeout;

  if (w.backend == "nccl") {  // checked before the rendezvous: no peer waits for a worker that cannot start
    try {
      w.cuda_device = cuda_device_for(w.env.local_rank, cuda_device_count(), std::getenv("CUDA_VISIBLE_DEVICES"));
    } catch (const ProcessGroupError& e) {
      throw ProcessGroupError(who + ": backend nccl: " + e.what());
    }
  }

  RendezvousOptions ro;
  ro.timeout = options.rendezvous_timeout;
  ro.store_timeout = w.timeout;
  Rendezvous rdzv = rendezvous(w.env, ro);
  w.store = rdzv.store;
  w.peers = std::move(rdzv.peers);
  // gloo's connections carry the round's key too (runtime/gloo_guard.hpp, record_auth.hpp).
  if (!w.env.job_secret.empty()) {
    GlooGuard::install(RecordAuth::for_round(w.env.job_secret, w.env.run_id, w.env.restart_count), who);
  }

  // The backend keeps its own keys apart from the run's other users of the store.
  c10::intrusive_ptr<c10d::Store> pg_store = c10::make_intrusive<c10d::PrefixStore>(w.backend, w.store);
  if (w.backend == "gloo") pg_store = c10::make_intrusive<GlooConnectStore>(pg_store);
  BackendRecord* record = nullptr;
  try {
    if (w.backend == "gloo") {
      GlooSetupScope guarded;  // gloo's listeners and pair connections (runtime/gloo_guard.hpp)
      auto opts = c10d::ProcessGroupGloo::Options::create(w.timeout);
      opts->devices.push_back(gloo_device(options, w.env, who, w.gloo_host));
      opts->threads = options.gloo_threads > 0 ? options.gloo_threads : 2;
      auto gloo =
          c10::make_intrusive<RecordedBackend<TickingProcessGroupGloo>>(pg_store, w.env.rank, w.env.world_size, opts);
      record = &gloo->record();
      record->open("world.pg", w.env.rank, w.env.world_size);
      w.pg = compat::wrap_backend(gloo, pg_store, w.backend);
    } else {
#ifdef LSPAWN_HAVE_NCCL
      set_cuda_device(w.cuda_device);
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = w.timeout;
      auto nccl =
          c10::make_intrusive<RecordedBackend<c10d::ProcessGroupNCCL>>(pg_store, w.env.rank, w.env.world_size, opts);
      record = &nccl->record();
      // NCCL's Work future completes when the kernels are queued, not when they finish: polled.
      record->open("world.pg", w.env.rank, w.env.world_size, Completion::Poll);
      w.pg = compat::wrap_backend(nccl, pg_store, w.backend);
#endif
    }
    // Nobody leaves before everyone has connected (rank 0 hosts the store others may still read).
    w.pg->barrier()->wait(w.timeout);
    // The program's collectives on World::pg enter the rank's status record from here on
    // (runtime/recorded_backend.hpp): the hang watch sees a rank waiting in one.
    if (record) record->start();
    if (auto* ticking = dynamic_cast<TickingProcessGroupGloo*>(compat::backend_of(w.pg).get())) {
      ticking->pause_ticking();
    }
    // Connected: nobody reads the plain (stranger) keys any more.
    if (rdzv.auth) rdzv.auth->watch_strangers(false);
  } catch (const ProcessGroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProcessGroupError(who + ": cannot set up the " + w.backend + " process group (store " + rdzv.host + ":" +
                            std::to_string(rdzv.port) + "): " + e.what());
  }
  w.init_time = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  return w;
}

}  // namespace lspawn
