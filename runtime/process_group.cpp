#include "runtime/process_group.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef LSPAWN_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace lspawn {
namespace {

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
  throw ProcessGroupError(who + ": no route to MASTER_ADDR='" + host + "' to choose the gloo interface: " +
                          why + " (set LSPAWN_GLOO_HOST or GLOO_SOCKET_IFNAME)");
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const InitOptions& options, const WorkerEnv& env,
                                                       const std::string& who) {
  std::string host = options.interface_host;
  if (host.empty()) host = getenv_or("LSPAWN_GLOO_HOST", "");
  try {
    if (host.empty()) {
      const std::string ifname = getenv_or("GLOO_SOCKET_IFNAME", "");
      if (!ifname.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
      host = env.group_world_size == 1 ? "127.0.0.1"
                                       : local_address_towards(env.master_addr, env.master_port, who);
    }
    return c10d::ProcessGroupGloo::createDeviceForHostname(host);
  } catch (const ProcessGroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProcessGroupError(who + ": cannot create the gloo device for '" + host + "': " + e.what());
  }
}

}  // namespace

bool have_nccl() {
#ifdef LSPAWN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

World init_process_group(const InitOptions& options) {
  const auto t0 = Clock::now();
  World w;
  w.env = options.env ? *options.env : WorkerEnv::from_environment();
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
    throw ProcessGroupError(who + ": backend 'nccl' requested but lspawn was built without NCCL "
                                  "(reconfigure with -DLSPAWN_WITH_NCCL=ON and a CUDA LibTorch)");
  }
  w.timeout = options.timeout.count() > 0 ? options.timeout
                                          : duration_from_environment("LSPAWN_PG_TIMEOUT").value_or(
                                                kDefaultCollectiveTimeout);
  if (w.timeout.count() <= 0) w.timeout = kDefaultCollectiveTimeout;

  RendezvousOptions ro;
  ro.timeout = options.rendezvous_timeout;
  ro.store_timeout = w.timeout;
  Rendezvous rdzv = rendezvous(w.env, ro);
  w.store = rdzv.store;
  w.peers = std::move(rdzv.peers);

  // The backend keeps its own keys apart from the run's other users of the store.
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>(w.backend, w.store);
  try {
    if (w.backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(w.timeout);
      opts->devices.push_back(gloo_device(options, w.env, who));
      opts->threads = options.gloo_threads > 0 ? options.gloo_threads : 2;
      w.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, w.env.rank, w.env.world_size, opts);
    } else {
#ifdef LSPAWN_HAVE_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = w.timeout;
      w.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, w.env.rank, w.env.world_size, opts);
#endif
    }
    // Nobody leaves before everyone has connected (rank 0 hosts the store others may still read).
    w.pg->barrier()->wait(w.timeout);
  } catch (const ProcessGroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw ProcessGroupError(who + ": cannot set up the " + w.backend + " process group (store " +
                            rdzv.host + ":" + std::to_string(rdzv.port) + "): " + e.what());
  }
  w.init_time = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  return w;
}

}  // namespace lspawn
