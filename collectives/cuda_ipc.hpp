// CudaIpc: collectives on CUDA tensors among the ranks of one node, device to device through
// CUDA IPC, with the shm communicator (shm/communicator.hpp) as the control plane.
//
//   Each rank keeps one scratch buffer of device memory (cudaMalloc, grown when a larger tensor
//   comes) and exports it (cudaIpcGetMemHandle). A collective: copy the input into the scratch,
//   exchange the handles through shm (an all_gather of 80 bytes per rank, which is also the
//   barrier "inputs ready"), open the peers' scratches that are new (cudaIpcOpenMemHandle, kept
//   until they change), then work on the device with ATen ops on the mapped peers' memory:
//     all_reduce: rank q folds element range q of every scratch, in rank order, into its own
//                 scratch (reduce-scatter); barrier; everyone copies every range q from rank q's
//                 scratch (all-gather); barrier (nobody overwrites a scratch a peer still reads).
//     broadcast:  everyone copies from the root's scratch; barrier.
//     all_gather: everyone copies every rank's scratch into its output; barrier.
//   So the result is identical on every rank (each element folded once, in rank order), as on the
//   host path. Same device or not: CUDA maps a peer's memory of another GPU too (peer access);
//   ranks on one GPU share its memory.
//
// When it is used (collectives/ops.cpp): for a CUDA tensor of at least min_bytes() in a group with
// shm, in a LibTorch with CUDA, unless LSPAWN_SHM_CUDA_IPC=0; the others are staged through pinned
// host memory and take the host path. min_bytes(): LSPAWN_SHM_CUDA_IPC_MIN_BYTES, default 2 MiB:
// on an H100 shared by 2 ranks an IPC all_reduce costs ~0.8 ms whatever its size (3 syncs and 3
// rounds with the other process's kernels time-sliced on the GPU), the staged one ~0.3 ms per
// MiB: 1 MiB 0.79 ms against 0.37, 8 MiB 0.84 ms against 2.6 (docs/benchmarks.md §11). Every rank must then pass a CUDA tensor (as with NCCL): a rank
// passing a CPU tensor meets the others' handle exchange and the shm communicator's descriptor
// check fails the op on every rank, naming the ranks (CollectiveMismatch), instead of a hang.
// When a rank cannot export or open a scratch (no IPC on this platform, out of memory), every
// rank learns it in the same exchange, returns false (the caller stages the tensor), and IPC is
// off for the group from then on: the "cuda ipc" line of describe() says why.
//
// Built only against a LibTorch with CUDA (LSPAWN_HAVE_CUDA_IPC); elsewhere available() is false.
#pragma once

#include "collectives/reduce_op.hpp"
#include "shm/communicator.hpp"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>

namespace lspawn {

class CudaIpc {
 public:
  // This build has it and LSPAWN_SHM_CUDA_IPC is not 0 (1 or unset; another value throws
  // std::invalid_argument naming the variable).
  static bool available();
  // available(), and when it is, LSPAWN_SHM_CUDA_IPC_MIN_BYTES: throws std::invalid_argument
  // naming a bad value (Group checks this before any backend connects).
  static void check_environment();

  // Reads LSPAWN_SHM_CUDA_IPC_MIN_BYTES (a byte count; another value throws
  // std::invalid_argument naming it). Touches no CUDA.
  explicit CudaIpc(shm::Communicator& comm);
  ~CudaIpc();
  CudaIpc(const CudaIpc&) = delete;
  CudaIpc& operator=(const CudaIpc&) = delete;

  // Collective, every rank with a CUDA tensor of the same shape and type. false: IPC is off for
  // this group (on every rank alike); the caller takes the staged path. Throws on a CUDA error or
  // a shm::Error (the group is broken then, as after any failed collective).
  // all_reduce: in place into `t` (any layout); Mean is left to the caller (the sum is here).
  bool all_reduce(at::Tensor& t, ReduceOp op);
  // `t` (contiguous) from `root` into every rank's `t`.
  bool broadcast(at::Tensor& t, int root);
  // `out` (contiguous, size * in.numel() elements) = every rank's `in`, in rank order.
  bool all_gather(const at::Tensor& in, at::Tensor& out);

  // Tensors of fewer bytes are staged (the same on every rank: the sizes agree).
  std::size_t min_bytes() const { return min_bytes_; }
  bool off() const { return off_; }
  // Why IPC is off ("" while it is on).
  const std::string& why_off() const { return why_off_; }

 private:
  struct Peers;
  // Copies `src` (may be undefined: nothing to export) into the scratch, exchanges the handles,
  // opens what changed. false when some rank could not (IPC is off from then on).
  bool exchange(const at::Tensor* src);
  // Rank `rank`'s scratch as `numel` elements of `type`, on the device its memory is on.
  at::Tensor view(int rank, at::ScalarType type, int64_t numel) const;

  shm::Communicator& comm_;
  std::unique_ptr<Peers> peers_;
  std::size_t min_bytes_ = std::size_t{2} << 20;
  bool off_ = false;
  std::string why_off_;
};

}  // namespace lspawn
