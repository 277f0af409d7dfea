/* lspawn's collective engine as a C ABI: the shared-memory communicator (shm/communicator.hpp)
 * and the status record's writer (status/recorder.hpp) behind plain C functions, built as the
 * torch-free library liblspawn_engine.so.
 *
 * Who uses it: the torch.distributed backend `lspawn` (python/lspawn/distributed/): one small shim
 * per torch release, built against that release's headers, CXX11 ABI and pybind11 settings, calls
 * the one engine through this header. C, not C++: the engine is built once (new libstdc++ ABI,
 * libstdc++ linked statically in the wheel) while a shim for pip torch <= 2.6 is built with
 * _GLIBCXX_USE_CXX11_ABI=0, so no std::string or std::function may cross. Every function is
 * thread-compatible (one caller per engine at a time; lspawn_engine_abort excepted), none throws,
 * and every failure fills an lspawn_engine_error.
 *
 * Semantics are the communicator's: every rank of a group calls the same operations in the same
 * order; each call returns when this rank's output is complete; a peer that died makes the others
 * fail within milliseconds, naming it (LSPAWN_ENGINE_PEER_DIED, `rank` = that rank as shown);
 * after any error the engine is broken and later calls fail at once (LSPAWN_ENGINE_BROKEN), and
 * it has left the group: a peer waiting for it fails within milliseconds too, though its process
 * lives on (LSPAWN_ENGINE_PEER_LEFT, with the reason it left), as after lspawn_engine_abort()
 * or lspawn_engine_destroy(). */
#ifndef LSPAWN_SHM_ENGINE_H
#define LSPAWN_SHM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#if defined(LSPAWN_ENGINE_BUILDING)
#define LSPAWN_ENGINE_API __attribute__((visibility("default")))
#else
#define LSPAWN_ENGINE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a signature or a constant below changes: a shim checks it at load.
 * 2: LSPAWN_ENGINE_PEER_LEFT, lspawn_engine_abort(). */
#define LSPAWN_ENGINE_ABI 2

/* Element types (shm::ElemType's order). */
enum {
  LSPAWN_ENGINE_FLOAT32 = 0,
  LSPAWN_ENGINE_FLOAT64 = 1,
  LSPAWN_ENGINE_FLOAT16 = 2,
  LSPAWN_ENGINE_BFLOAT16 = 3,
  LSPAWN_ENGINE_INT8 = 4,
  LSPAWN_ENGINE_UINT8 = 5,
  LSPAWN_ENGINE_INT32 = 6,
  LSPAWN_ENGINE_INT64 = 7,
  LSPAWN_ENGINE_BOOL = 8
};
/* Reductions (shm::KernelOp's order). Mean is the caller's: sum, then divide. */
enum {
  LSPAWN_ENGINE_SUM = 0,
  LSPAWN_ENGINE_PRODUCT = 1,
  LSPAWN_ENGINE_MIN = 2,
  LSPAWN_ENGINE_MAX = 3,
  LSPAWN_ENGINE_BAND = 4,
  LSPAWN_ENGINE_BOR = 5,
  LSPAWN_ENGINE_BXOR = 6
};
/* lspawn_engine_error::kind (0: no error). */
enum {
  LSPAWN_ENGINE_OK = 0,
  LSPAWN_ENGINE_TIMEOUT = 1,
  LSPAWN_ENGINE_PEER_DIED = 2,
  LSPAWN_ENGINE_MISMATCH = 3,
  LSPAWN_ENGINE_BROKEN = 4,
  LSPAWN_ENGINE_SYSTEM = 5,
  LSPAWN_ENGINE_INVALID = 6,
  LSPAWN_ENGINE_PEER_LEFT = 7 /* a peer left the group alive (its engine failed, was aborted or destroyed) */
};

typedef struct lspawn_engine_error {
  int kind;           /* LSPAWN_ENGINE_* above */
  int rank;           /* the rank concerned (dead, late, mismatching) as messages show it, or -1 */
  char message[1024]; /* what failed, with the ranks, pids and timeout; NUL-terminated */
} lspawn_engine_error;

/* The rendezvous of the segment's name: the group's store. `set` returns 0 or fills err;
 * `get` blocks until the key exists (the store's own timeout), writes at most `cap` bytes and
 * returns the value's length, or -1 after filling err. */
typedef int (*lspawn_engine_set_fn)(void* ctx, const char* key, const void* value, size_t len,
                                    lspawn_engine_error* err);
typedef long (*lspawn_engine_get_fn)(void* ctx, const char* key, void* buf, size_t cap, lspawn_engine_error* err);

typedef struct lspawn_engine lspawn_engine;

LSPAWN_ENGINE_API int lspawn_engine_abi(void);

/* Collective over the `size` ranks of one host. `label` names the segment in /dev/shm (a group
 * name); `shown_ranks` (NULL or `size` ints) are the numbers messages give the ranks (their
 * global ranks); `timeout_ms` bounds every call. NULL on failure, with err filled. */
LSPAWN_ENGINE_API lspawn_engine* lspawn_engine_create(int rank, int size, const char* label, int64_t timeout_ms,
                                                      const int* shown_ranks, lspawn_engine_set_fn set,
                                                      lspawn_engine_get_fn get, void* ctx, lspawn_engine_error* err);
LSPAWN_ENGINE_API void lspawn_engine_destroy(lspawn_engine* engine);
/* Leaves the group without destroying the engine: it is broken (later calls fail at once), and
 * the peers waiting for this rank fail at once with LSPAWN_ENGINE_PEER_LEFT quoting `reason`.
 * For an owner whose op failed outside the engine (the step between hosts). Safe to repeat.
 * The one function that may be called from another thread while a call runs (a watchdog): that
 * call then fails within ~20 ms with LSPAWN_ENGINE_BROKEN ("aborted while waiting"). */
LSPAWN_ENGINE_API void lspawn_engine_abort(lspawn_engine* engine, const char* reason);

/* 1 when `op` is defined on `type` (bitwise ops on integer and bool types only). */
LSPAWN_ENGINE_API int lspawn_engine_supports(int type, int op);

/* Each returns 0, or the error's kind after filling err. */
LSPAWN_ENGINE_API int lspawn_engine_all_reduce(lspawn_engine* engine, void* data, size_t count, int type, int op,
                                               lspawn_engine_error* err);
LSPAWN_ENGINE_API int lspawn_engine_broadcast(lspawn_engine* engine, void* data, size_t bytes, int root,
                                              lspawn_engine_error* err);
/* out (size * bytes) = every rank's `in` (bytes each), in rank order. */
LSPAWN_ENGINE_API int lspawn_engine_all_gather(lspawn_engine* engine, const void* in, size_t bytes, void* out,
                                               lspawn_engine_error* err);
LSPAWN_ENGINE_API int lspawn_engine_barrier(lspawn_engine* engine, lspawn_engine_error* err);

/* The status record (docs/hang-diagnosis.md), for a backend whose operations it brackets,
 * whatever carries them (this engine or another transport). `slot` is a status::GroupSlot of
 * this rank's record, claimed by whoever owns the record in this process (Python:
 * lspawn_hang.claim_slot()); NULL: not recorded, the calls do nothing. Any thread may write.
 * `op`: a name such as "all_reduce" (cut to 23 characters); `seq`: 1, 2, ... per group. */
LSPAWN_ENGINE_API void lspawn_status_enter(void* slot, const char* op, uint64_t seq, uint64_t bytes);
LSPAWN_ENGINE_API void lspawn_status_complete(void* slot, uint64_t seq);

#ifdef __cplusplus
}
#endif

#endif
