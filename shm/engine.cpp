// liblspawn_engine.so: shm/engine.h over shm::Communicator and status::SlotWriter. Every C++
// exception stops here and becomes an lspawn_engine_error.
#include "shm/engine.h"

#include "shm/communicator.hpp"
#include "status/recorder.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

struct lspawn_engine {
  std::unique_ptr<lspawn::shm::Communicator> comm;
};

namespace {

using lspawn::shm::ElemType;
using lspawn::shm::KernelOp;

static_assert(LSPAWN_ENGINE_FLOAT32 == static_cast<int>(ElemType::Float32) &&
                  LSPAWN_ENGINE_BFLOAT16 == static_cast<int>(ElemType::BFloat16) &&
                  LSPAWN_ENGINE_INT64 == static_cast<int>(ElemType::Int64) &&
                  LSPAWN_ENGINE_BOOL == static_cast<int>(ElemType::Bool),
              "engine.h's element types follow shm::ElemType");
static_assert(LSPAWN_ENGINE_SUM == static_cast<int>(KernelOp::Sum) &&
                  LSPAWN_ENGINE_MAX == static_cast<int>(KernelOp::Max) &&
                  LSPAWN_ENGINE_BXOR == static_cast<int>(KernelOp::BitwiseXor),
              "engine.h's reductions follow shm::KernelOp");

void set_error(lspawn_engine_error* err, int kind, int rank, const char* message) {
  if (!err) return;
  err->kind = kind;
  err->rank = rank;
  std::snprintf(err->message, sizeof err->message, "%s", message);
}

int kind_of(lspawn::shm::Error::Kind k) {
  using K = lspawn::shm::Error::Kind;
  switch (k) {
    case K::Timeout: return LSPAWN_ENGINE_TIMEOUT;
    case K::PeerDied: return LSPAWN_ENGINE_PEER_DIED;
    case K::Mismatch: return LSPAWN_ENGINE_MISMATCH;
    case K::Broken: return LSPAWN_ENGINE_BROKEN;
    case K::System: return LSPAWN_ENGINE_SYSTEM;
    case K::PeerLeft: return LSPAWN_ENGINE_PEER_LEFT;
  }
  return LSPAWN_ENGINE_SYSTEM;
}

// Runs `f`; any exception becomes err (its kind's number is returned).
template <typename F>
int guarded(lspawn_engine_error* err, const std::vector<int>* shown, F&& f) {
  try {
    f();
    if (err) err->kind = LSPAWN_ENGINE_OK;
    return LSPAWN_ENGINE_OK;
  } catch (const lspawn::shm::Error& e) {
    int rank = e.ranks().empty() ? -1 : e.ranks().front();
    if (rank >= 0 && shown && static_cast<std::size_t>(rank) < shown->size()) rank = (*shown)[rank];
    set_error(err, kind_of(e.kind()), rank, e.what());
    return kind_of(e.kind());
  } catch (const std::bad_alloc&) {
    set_error(err, LSPAWN_ENGINE_SYSTEM, -1, "lspawn engine: out of memory");
    return LSPAWN_ENGINE_SYSTEM;
  } catch (const std::exception& e) {
    set_error(err, LSPAWN_ENGINE_SYSTEM, -1, e.what());
    return LSPAWN_ENGINE_SYSTEM;
  }
}

bool valid_type(int t) { return t >= LSPAWN_ENGINE_FLOAT32 && t <= LSPAWN_ENGINE_BOOL; }
bool valid_op(int op) { return op >= LSPAWN_ENGINE_SUM && op <= LSPAWN_ENGINE_BXOR; }

int invalid(lspawn_engine_error* err, const std::string& what) {
  set_error(err, LSPAWN_ENGINE_INVALID, -1, ("lspawn engine: " + what).c_str());
  return LSPAWN_ENGINE_INVALID;
}

// The store's errors, carried out of the callbacks through the communicator as an exception.
struct StoreFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

extern "C" {

int lspawn_engine_abi(void) { return LSPAWN_ENGINE_ABI; }

lspawn_engine* lspawn_engine_create(int rank, int size, const char* label, int64_t timeout_ms, const int* shown_ranks,
                                    lspawn_engine_set_fn set, lspawn_engine_get_fn get, void* ctx,
                                    lspawn_engine_error* err) {
  if (size < 1 || rank < 0 || rank >= size) {
    invalid(err, "rank " + std::to_string(rank) + " of " + std::to_string(size) + " is not a rank of the group");
    return nullptr;
  }
  if (!set || !get) {
    invalid(err, "no rendezvous (set/get) given");
    return nullptr;
  }
  if (timeout_ms <= 0) {
    invalid(err, "timeout " + std::to_string(timeout_ms) + " ms is not positive");
    return nullptr;
  }
  lspawn::shm::CommOptions options;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  if (label && *label) options.label = label;
  if (shown_ranks) options.shown_ranks.assign(shown_ranks, shown_ranks + size);
  lspawn::shm::Rendezvous rendezvous;
  rendezvous.set = [=](const std::string& key, const std::string& value) {
    lspawn_engine_error e{};
    if (set(ctx, key.c_str(), value.data(), value.size(), &e) != 0) throw StoreFailure(e.message);
  };
  rendezvous.get = [=](const std::string& key) {
    lspawn_engine_error e{};
    std::string value(4096, '\0');
    const long n = get(ctx, key.c_str(), value.data(), value.size(), &e);
    if (n < 0) throw StoreFailure(e.message);
    value.resize(std::min<std::size_t>(static_cast<std::size_t>(n), value.size()));
    return value;
  };
  auto engine = std::make_unique<lspawn_engine>();
  const int rc = guarded(err, &options.shown_ranks, [&] {
    engine->comm = std::make_unique<lspawn::shm::Communicator>(rank, size, rendezvous, options);
  });
  return rc == LSPAWN_ENGINE_OK ? engine.release() : nullptr;
}

void lspawn_engine_destroy(lspawn_engine* engine) { delete engine; }

void lspawn_engine_abort(lspawn_engine* engine, const char* reason) {
  if (!engine) return;
  try {
    engine->comm->abort(reason ? reason : "aborted by its owner");
  } catch (...) {
    // nothing throws here but an allocation failure: the communicator is broken already
  }
}

int lspawn_engine_supports(int type, int op) {
  return valid_type(type) && valid_op(op) &&
         lspawn::shm::kernel_supports(static_cast<ElemType>(type), static_cast<KernelOp>(op));
}

int lspawn_engine_all_reduce(lspawn_engine* engine, void* data, size_t count, int type, int op,
                             lspawn_engine_error* err) {
  if (!lspawn_engine_supports(type, op))
    return invalid(err, "all_reduce: reduction " + std::to_string(op) + " on element type " + std::to_string(type) +
                            " is not supported");
  return guarded(err, &engine->comm->options().shown_ranks, [&] {
    engine->comm->all_reduce(data, count, static_cast<ElemType>(type), static_cast<KernelOp>(op));
  });
}

int lspawn_engine_broadcast(lspawn_engine* engine, void* data, size_t bytes, int root, lspawn_engine_error* err) {
  if (root < 0 || root >= engine->comm->size())
    return invalid(err, "broadcast: root " + std::to_string(root) + " is not a rank of the group of " +
                            std::to_string(engine->comm->size()));
  return guarded(err, &engine->comm->options().shown_ranks, [&] { engine->comm->broadcast(data, bytes, root); });
}

int lspawn_engine_all_gather(lspawn_engine* engine, const void* in, size_t bytes, void* out, lspawn_engine_error* err) {
  return guarded(err, &engine->comm->options().shown_ranks, [&] { engine->comm->all_gather(in, bytes, out); });
}

int lspawn_engine_barrier(lspawn_engine* engine, lspawn_engine_error* err) {
  return guarded(err, &engine->comm->options().shown_ranks, [&] { engine->comm->barrier(); });
}

void lspawn_status_enter(void* slot, const char* op, uint64_t seq, uint64_t bytes) {
  if (!slot) return;
  lspawn::status::SlotWriter(static_cast<lspawn::status::GroupSlot*>(slot), lspawn::status::Writers::Many)
      .enter(op, seq, bytes);
}

void lspawn_status_complete(void* slot, uint64_t seq) {
  if (!slot) return;
  lspawn::status::SlotWriter(static_cast<lspawn::status::GroupSlot*>(slot), lspawn::status::Writers::Many)
      .complete(seq);
}

}  // extern "C"
