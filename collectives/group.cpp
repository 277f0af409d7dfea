#include "collectives/group.hpp"

#include "collectives/cuda_ipc.hpp"

#include "collectives/error.hpp"
#include "collectives/hierarchy.hpp"
#include "runtime/cuda_device.hpp"
#include "runtime/gloo_guard.hpp"
#include "runtime/recorded_backend.hpp"
#include "runtime/torch_compat.hpp"
#include "supervisor/worker_failure.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#ifdef LSPAWN_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace lspawn {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// Host identity: LSPAWN_NODE_ID when set (tests, containers sharing a host name), else the host
// name plus the kernel's boot id (two containers with one host name on different machines differ).
std::string this_node_id() {
  if (const char* id = std::getenv("LSPAWN_NODE_ID"); id && *id) return id;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + "/" + boot;
}

GroupOptions resolve(GroupOptions o) {
  if (o.backend == Backend::Default) {
    const std::string b = env_or("LSPAWN_BACKEND", "auto");
    if (b == "auto")
      o.backend = Backend::Auto;
    else if (b == "gloo")
      o.backend = Backend::Gloo;
    else if (b == "shm")
      o.backend = Backend::Shm;
    else if (b == "nccl")
      o.backend = Backend::Nccl;
    else
      throw std::invalid_argument("LSPAWN_BACKEND='" + b + "' is not one of shm, gloo, auto, nccl");
  }
  if (o.timeout.count() <= 0) {
    o.timeout = std::chrono::minutes(30);
    const std::string t = env_or("LSPAWN_PG_TIMEOUT", "");
    if (!t.empty()) {
      char* end = nullptr;
      const double s = std::strtod(t.c_str(), &end);
      if (end == t.c_str() || *end || s <= 0)
        throw std::invalid_argument("LSPAWN_PG_TIMEOUT='" + t + "' is not a positive number of seconds");
      o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
    }
  }
  if (!o.checked) o.checked = env_or("LSPAWN_COLLECTIVES_CHECKED", "0") == "1";
  if (o.name.empty()) o.name = "world";
  return o;
}

// The device gloo binds to: GroupOptions::gloo_host, else loopback on one node; across nodes
// LSPAWN_GLOO_HOST, else the interface GLOO_SOCKET_IFNAME names, else the address this host's
// name resolves to (gloo's default device).
std::shared_ptr<::gloo::transport::Device> gloo_device(const GroupOptions& o, bool one_node) {
  if (!o.gloo_host.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(o.gloo_host);
  if (one_node) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  const std::string host = env_or("LSPAWN_GLOO_HOST", "");
  if (!host.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(host);
  const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
  if (!ifname.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// A gloo process group of `size` ranks under "<prefix>" of `store`. With `record` (the group's
// own process group, which DDP's Reducer and a program may use directly): its ops enter the
// status slot "<group>.gloo" (runtime/recorded_backend.hpp), once *record is started.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::string& prefix, int rank, int size, const GroupOptions& o,
                                                 bool one_node, BackendRecord** record = nullptr) {
  // gloo's connections carry the job's secret when it has one (runtime/gloo_guard.hpp).
  GlooGuard::install_from_environment("rank " + std::to_string(rank) + "/" + std::to_string(size));
  GlooSetupScope guarded;
  auto gopts = c10d::ProcessGroupGloo::Options::create(o.timeout);
  gopts->devices.push_back(gloo_device(o, one_node));
  gopts->threads = 2;
  auto gstore = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  if (!record) {
    return compat::wrap_backend(c10::make_intrusive<c10d::ProcessGroupGloo>(gstore, rank, size, gopts), gstore, "gloo");
  }
  auto gloo = c10::make_intrusive<RecordedBackend<c10d::ProcessGroupGloo>>(gstore, rank, size, gopts);
  gloo->record().open(o.name + ".gloo", rank, size);
  *record = &gloo->record();
  return compat::wrap_backend(gloo, gstore, "gloo");
}

// A shm communicator of `size` ranks of one node, meeting under "<prefix>" of `store`.
std::unique_ptr<shm::Communicator> make_shm(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                            int rank, int size, const GroupOptions& o, const std::string& label,
                                            std::vector<int> shown_ranks) {
  shm::Rendezvous rv;
  rv.set = [store, prefix](const std::string& k, const std::string& v) {
    store->set(prefix + k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  rv.get = [store, prefix](const std::string& k) {
    const auto v = store->get(prefix + k);
    return std::string(v.begin(), v.end());
  };
  shm::CommOptions so;
  so.slot_bytes = o.shm_slot_bytes;
  so.flat_max_bytes = o.shm_flat_max_bytes;
  so.timeout = o.timeout;
  so.label = label;
  so.shown_ranks = std::move(shown_ranks);
  return std::make_unique<shm::Communicator>(rank, size, rv, so);
}

}  // namespace

bool have_nccl_backend() {
#ifdef LSPAWN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

const char* to_string(Backend b) {
  switch (b) {
    case Backend::Default: return "default";
    case Backend::Auto: return "auto";
    case Backend::Gloo: return "gloo";
    case Backend::Shm: return "shm";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

std::shared_ptr<Group> Group::create(c10::intrusive_ptr<c10d::Store> store, int rank, int size, GroupOptions options) {
  options = resolve(std::move(options));
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("lspawn::Group::create: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(size) + ")");
  auto own = c10::make_intrusive<c10d::PrefixStore>("coll/" + options.name, store);
  std::vector<std::string> nodes(size);
  try {
    const std::string id = this_node_id();
    own->set("node/" + std::to_string(rank), std::vector<uint8_t>(id.begin(), id.end()));
    for (int q = 0; q < size; ++q) {
      const auto v = own->get("node/" + std::to_string(q));
      nodes[q].assign(v.begin(), v.end());
    }
  } catch (const std::exception& e) {
    throw CollectiveError("create", options.name, {},
                          "lspawn: group '" + options.name + "' rank " + std::to_string(rank) + "/" +
                              std::to_string(size) + ": exchanging node ids through the store failed: " + e.what());
  }
  std::vector<int> root(size);
  for (int q = 0; q < size; ++q) root[q] = q;
  return build(own, rank, size, std::move(options), std::move(nodes), std::move(root));
}

std::shared_ptr<Group> Group::build(c10::intrusive_ptr<c10d::Store> store, int rank, int size, GroupOptions options,
                                    std::vector<std::string> node_ids, std::vector<int> root_ranks) {
  std::shared_ptr<Group> g(new Group());
  g->rank_ = rank;
  g->size_ = size;
  g->options_ = std::move(options);
  g->store_ = std::move(store);
  g->node_ids_ = std::move(node_ids);
  g->root_ranks_ = std::move(root_ranks);
  // A peer's death is an error from the collective, not a SIGPIPE that kills this rank without a
  // word: gloo writes with writev(2). init_process_group() does the same, but a group may be
  // created on a store of its own (Group::create) without it.
  ignore_sigpipe_if_default();
  // Claimed before the backends connect: a rank that hangs while creating the group is still
  // known as a member, and shows as "in create_group".
  g->status_ = status::Recorder::process().add_group(g->options_.name, rank, size);
  g->status_.enter("create_group", 0, 0);
  struct Created {
    status::SlotWriter& slot;
    ~Created() { slot.complete(0); }
  } created{g->status_};
  const bool one_node =
      std::all_of(g->node_ids_.begin(), g->node_ids_.end(), [&](const std::string& n) { return n == g->node_ids_[0]; });
  const std::string who = "group '" + g->options_.name + "' rank " + std::to_string(rank) + "/" + std::to_string(size);
  if (g->options_.backend == Backend::Shm && !one_node) {
    std::string nodes;
    for (int q = 0; q < size; ++q) nodes += (q ? ", " : "") + std::to_string(q) + "@" + g->node_ids_[q];
    throw CollectiveError("create", g->options_.name, {},
                          "lspawn: " + who + ": backend shm needs all ranks on one node, but they are on: " + nodes);
  }
  if (size > 1 && g->options_.backend != Backend::Gloo && g->options_.backend != Backend::Nccl) {
    // The shm path's environment, before any backend connects: a bad value fails every rank
    // alike and names itself, instead of a faster peer failing first and the others seeing
    // its gloo connection closed (seen in CI: "Connection closed by peer").
    try {
      (void)shm::single_copy_from_env();
      CudaIpc::check_environment();
    } catch (const std::exception& e) {
      throw CollectiveError("create", g->options_.name, {}, "lspawn: " + who + ": shm setup failed: " + e.what());
    }
  }
  if (g->options_.backend == Backend::Nccl) {
#ifdef LSPAWN_HAVE_NCCL
    if (cuda_device_count() == 0) {  // NCCL is built in, but this process sees no GPU
      throw CollectiveError("create", g->options_.name, {},
                            "lspawn: " + who +
                                ": backend nccl needs a CUDA device, but none is visible "
                                "(CUDA_VISIBLE_DEVICES " +
                                env_or("CUDA_VISIBLE_DEVICES", "unset") + "): use gloo or shm");
    }
    try {
      auto nopts = c10d::ProcessGroupNCCL::Options::create();
      nopts->timeout = g->options_.timeout;
      auto nstore = c10::make_intrusive<c10d::PrefixStore>("nccl", g->store_);
      auto nccl = c10::make_intrusive<RecordedBackend<c10d::ProcessGroupNCCL>>(nstore, rank, size, nopts);
      // NCCL's Work future completes when the kernels are queued, not when they finish: polled.
      nccl->record().open(g->options_.name + ".nccl", rank, size, Completion::Poll);
      g->pg_record_ = &nccl->record();
      g->gloo_ = compat::wrap_backend(nccl, nstore, "nccl");
    } catch (const std::exception& e) {
      throw CollectiveError("create", g->options_.name, {}, "lspawn: " + who + ": NCCL setup failed: " + e.what());
    }
    g->nccl_ = true;
    g->pg_record_->start();
    return g;
#else
    throw CollectiveError("create", g->options_.name, {},
                          "lspawn: " + who +
                              ": backend nccl is not built in (configure with "
                              "-DLSPAWN_WITH_NCCL=ON against a CUDA LibTorch with NCCL)");
#endif
  }
  try {
    g->gloo_ = make_gloo(g->store_, "gloo", rank, size, g->options_, one_node, &g->pg_record_);
  } catch (const std::exception& e) {
    throw CollectiveError("create", g->options_.name, {}, "lspawn: " + who + ": gloo setup failed: " + e.what());
  }
  if (size > 1 && one_node && g->options_.backend != Backend::Gloo) {
    try {
      g->shm_ = make_shm(g->store_, "shm/", rank, size, g->options_, g->options_.name, {});
    } catch (const std::exception& e) {
      throw CollectiveError("create", g->options_.name, {}, "lspawn: " + who + ": shm setup failed: " + e.what());
    }
    if (CudaIpc::available()) g->cuda_ipc_ = std::make_unique<CudaIpc>(*g->shm_);  // touches no CUDA yet
  }
  if (size > 1 && !one_node && g->options_.backend == Backend::Auto) {
    NodeLayout layout = NodeLayout::of(g->node_ids_, rank);
    // With one member per node the leaders are the whole group: flat gloo is the same thing.
    if (layout.max_members() > 1) {
      auto hstore = c10::make_intrusive<c10d::PrefixStore>("hier", g->store_);
      c10::intrusive_ptr<c10d::ProcessGroup> leaders;
      std::unique_ptr<shm::Communicator> local;
      const auto& members = layout.members[layout.node];
      try {
        if (layout.leader())
          leaders = make_gloo(hstore, "leaders/gloo", layout.node, layout.nodes(), g->options_, false);
        local = make_shm(hstore, "node" + std::to_string(layout.node) + "/shm/", layout.local_rank,
                         static_cast<int>(members.size()), g->options_,
                         g->options_.name + ".node" + std::to_string(layout.node), members);
      } catch (const std::exception& e) {
        throw CollectiveError("create", g->options_.name, {},
                              "lspawn: " + who + ": hierarchical setup (node " + std::to_string(layout.node) + " of " +
                                  std::to_string(layout.nodes()) + ") failed: " + e.what());
      }
      const auto note_wait = std::min<std::chrono::milliseconds>(g->options_.timeout, std::chrono::seconds(3));
      g->hier_ =
          std::make_unique<Hierarchy>(std::move(layout), std::move(local), std::move(leaders), hstore, note_wait);
    }
  }
  if (g->pg_record_) g->pg_record_->start();
  return g;
}

Group::~Group() = default;

std::string Group::backend() const { return nccl_ ? "nccl" : shm_ ? "shm+gloo" : hier_ ? "hierarchical" : "gloo"; }

std::string Group::describe() const {
  std::ostringstream s;
  s << "group '" << options_.name << "' (rank " << rank_ << "/" << size_ << ", pid " << ::getpid() << ", backend "
    << backend() << ")";
  return s.str();
}

std::shared_ptr<Group> Group::new_group(const std::vector<int>& ranks) { return new_group(ranks, options_); }

std::shared_ptr<Group> Group::new_group(const std::vector<int>& ranks, GroupOptions options) {
  const int n = ++subgroups_;
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size_ || !seen.insert(r).second) {
      std::ostringstream s;
      s << "lspawn: new_group on " << describe() << ": ranks must be distinct members of [0, " << size_ << "), got";
      for (int q : ranks) s << " " << q;
      throw std::invalid_argument(s.str());
    }
  }
  if (ranks.empty()) throw std::invalid_argument("lspawn: new_group on " + describe() + ": empty rank list");
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  options.name = options_.name + "." + std::to_string(n);
  options = resolve(std::move(options));
  std::vector<std::string> nodes;
  std::vector<int> root;
  for (int r : ranks) {
    nodes.push_back(node_ids_[r]);
    root.push_back(root_ranks_[r]);
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>("sub" + std::to_string(n), store_);
  return build(store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), std::move(options),
               std::move(nodes), std::move(root));
}

std::vector<int> Group::ranks_not_reaching(std::uint64_t sequence, std::chrono::milliseconds wait) {
  std::vector<int> missing;
  try {
    const auto key = [](int q) { return "progress/" + std::to_string(q); };
    const std::string mine = std::to_string(sequence);
    store_->set(key(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      missing.clear();
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        bool reached = false;
        if (store_->check({key(q)})) {
          const auto v = store_->get(key(q));
          reached = std::strtoull(std::string(v.begin(), v.end()).c_str(), nullptr, 10) >= sequence;
        }
        if (!reached) missing.push_back(q);
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) return missing;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (...) {
    return {};
  }
}

}  // namespace lspawn
