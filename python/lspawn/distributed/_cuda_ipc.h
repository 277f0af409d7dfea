// CudaIpc: the torch.distributed backend's collectives on CUDA tensors among the ranks of one host,
// device to device through CUDA IPC, with the engine (shm/engine.h) as the control plane. The same
// protocol as lspawn's C++ runtime (collectives/cuda_ipc.hpp, measured on an H100 there), for the shim
// (_shim.cpp), which is compiled from the wheel's files alone against the user's torch:
//
//   Each rank keeps one scratch buffer of device memory (cudaMalloc, grown when a larger tensor comes)
//   and exports it (cudaIpcGetMemHandle). A collective: copy the input into the scratch, exchange the
//   handles through the engine (an all_gather of a Record per rank, which is also the barrier "inputs
//   ready"), open the peers' scratches that are new (cudaIpcOpenMemHandle, kept until they change),
//   then work on the device with ATen ops on the mapped peers' memory:
//     all_reduce: rank q folds element range q of every scratch, in rank order, into its own scratch
//                 (reduce-scatter); barrier; everyone copies every range q from rank q's scratch
//                 (all-gather); barrier (nobody overwrites a scratch a peer still reads).
//     broadcast:  everyone copies from the root's scratch; barrier.
//     all_gather: everyone copies every rank's scratch into its output; barrier.
//   Each element is folded once, in rank order: the result is identical on every rank.
//
// A copy of that protocol, not a shared source: collectives/cuda_ipc.cpp is part of liblspawn, built with
// the CUDA toolkit and linked to libcudart and shm::Communicator; this one is compiled by users from the
// wheel's files against their torch's headers alone, with the engine's C ABI as its control plane. A change
// to the protocol of one is made to the other.
//
// No CUDA header and no CUDA library at build time: the CUDA runtime calls are looked up when the first
// CUDA tensor comes, in the libcudart the process's torch loaded (_cudart.h).
//
// When it is used (_shim.cpp): a CUDA tensor of at least CudaIpcSettings::min_bytes in a group on one host,
// unless LSPAWN_SHM_CUDA_IPC=0; a smaller one, or one in a group spanning hosts, is staged through host memory.
// Every rank must pass a CUDA tensor of the same shape and type, as with NCCL: a rank that disagrees
// fails the op on every rank, naming it. When a rank cannot export or open a scratch (no libcudart
// loaded, no IPC on this platform, out of memory), every rank learns it in the same exchange and
// stages the tensor, and IPC is off for the group from then on (why_off()).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "_cudart.h"
#include "engine.h"

namespace lspawn_backend {

// When the backend takes CUDA IPC, from the environment. from_environment() throws std::invalid_argument
// naming a bad value ("lspawn backend: LSPAWN_SHM_CUDA_IPC='yes': expected ...").
struct CudaIpcSettings {
  bool wanted = true;  // LSPAWN_SHM_CUDA_IPC: 1 or unset, or 0 (every CUDA tensor staged)
  // LSPAWN_SHM_CUDA_IPC_MIN_BYTES: tensors of fewer bytes are staged (the same on every rank: the sizes agree).
  // 2 MiB as in the C++ runtime (docs/benchmarks.md §11: on an H100 an IPC all_reduce costs ~0.8 ms whatever
  // its size, a staged one ~0.3 ms per MiB).
  std::size_t min_bytes = std::size_t{2} << 20;

  static CudaIpcSettings from_environment() {
    CudaIpcSettings s;
    if (const char* v = std::getenv("LSPAWN_SHM_CUDA_IPC"); v != nullptr && *v != '\0' && std::string(v) != "1") {
      if (std::string(v) != "0")
        throw std::invalid_argument(std::string("lspawn backend: LSPAWN_SHM_CUDA_IPC='") + v +
                                    "': expected 1 (CUDA tensors device to device through CUDA IPC) or 0 (staged "
                                    "through host memory)");
      s.wanted = false;
    }
    if (const char* v = std::getenv("LSPAWN_SHM_CUDA_IPC_MIN_BYTES"); v != nullptr && *v != '\0') {
      char* end = nullptr;
      errno = 0;
      const unsigned long long n = std::strtoull(v, &end, 10);
      if (*v == '-' || end == v || *end != '\0' || errno == ERANGE)
        throw std::invalid_argument(std::string("lspawn backend: LSPAWN_SHM_CUDA_IPC_MIN_BYTES='") + v +
                                    "': expected a byte count (CUDA tensors of fewer bytes are staged through host "
                                    "memory)");
      s.min_bytes = static_cast<std::size_t>(n);
    }
    return s;
  }
};

class CudaIpc {
 public:
  enum class Op : std::uint32_t { AllReduce = 1, Broadcast = 2, AllGather = 3 };

  // rank/size: on the engine (this host's ranks); shown: each one's global rank, for errors. all_gather:
  // `n` bytes of every rank into `out` (size * n), barrier: the engine's, both throwing on failure.
  CudaIpc(int rank, int size, std::vector<int> shown, std::function<void(const void*, std::size_t, void*)> all_gather,
          std::function<void()> barrier)
      : rank_(rank), size_(size), shown_(std::move(shown)), all_gather_(std::move(all_gather)),
        barrier_(std::move(barrier)) {
    previous_.resize(size);
    mapped_.assign(size, nullptr);
    mapped_device_.assign(size, -1);
  }
  ~CudaIpc() {
    // At process exit CUDA may be torn down already: errors are ignored.
    const Cudart& c = Cudart::get();
    if (!c.ok()) return;
    for (int q = 0; q < size_; ++q) close(q);
    if (scratch_) c.free(scratch_);
    free_retired();
    c.get_last_error();
  }
  CudaIpc(const CudaIpc&) = delete;
  CudaIpc& operator=(const CudaIpc&) = delete;

  bool off() const { return off_; }
  const std::string& why_off() const { return why_off_; }

  // Collective, every rank with a CUDA tensor of the same shape and type. false: IPC is off for this group
  // (on every rank alike); the caller stages. Throws on a CUDA error or a failure of the engine.
  // In place into `t` (any layout), `op` an engine reduction (LSPAWN_ENGINE_SUM ...); the mean is the
  // caller's (the sum is here).
  bool all_reduce(at::Tensor& t, int op) {
    if (off_) return false;
    if (t.numel() == 0) return true;
    c10::DeviceGuard guard(t.device());
    at::Tensor work = t.is_contiguous() ? t : t.contiguous();
    if (!exchange(Op::AllReduce, op, work, &work)) return false;
    const int64_t numel = work.numel();
    const auto type = work.scalar_type();
    const c10::Device dev = work.device();
    auto lo = [&](int q) { return numel * q / size_; };
    // Reduce-scatter: range `rank_` of every scratch, folded in rank order, into my scratch.
    if (const int64_t len = lo(rank_ + 1) - lo(rank_); len > 0) {
      at::Tensor acc = view(0, type, numel).narrow(0, lo(rank_), len).to(dev, type, false, /*copy=*/true);
      for (int q = 1; q < size_; ++q) {
        fold(acc, view(q, type, numel).narrow(0, lo(rank_), len).to(dev), op);
      }
      view(rank_, type, numel).narrow(0, lo(rank_), len).copy_(acc);
    }
    sync(dev);
    barrier_();
    // All-gather: range q from rank q's scratch.
    at::Tensor flat = work.view({-1});
    for (int q = 0; q < size_; ++q)
      if (const int64_t len = lo(q + 1) - lo(q); len > 0)
        flat.narrow(0, lo(q), len).copy_(view(q, type, numel).narrow(0, lo(q), len));
    if (!work.is_same(t)) t.copy_(work);
    sync(dev);
    barrier_();  // nobody writes its scratch again while a peer still reads it
    return true;
  }

  // `t` (any layout) from `root` into every rank's `t`.
  bool broadcast(at::Tensor& t, int root) {
    if (off_) return false;
    if (t.numel() == 0) return true;
    c10::DeviceGuard guard(t.device());
    at::Tensor work = t.is_contiguous() ? t : t.contiguous();
    if (!exchange(Op::Broadcast, root, work, rank_ == root ? &work : nullptr)) return false;
    if (rank_ != root) {
      work.view({-1}).copy_(view(root, t.scalar_type(), t.numel()));
      if (!work.is_same(t)) t.copy_(work);
    }
    sync(t.device());
    barrier_();
    return true;
  }

  // `out` (size * in.numel() elements of in's type, any layout, any device) = every rank's `in`, in rank order.
  bool all_gather(const at::Tensor& in, at::Tensor& out) {
    if (off_) return false;
    if (in.numel() == 0) return true;
    c10::DeviceGuard guard(in.device());
    at::Tensor src = in.is_contiguous() ? in : in.contiguous();
    if (!exchange(Op::AllGather, 0, src, &src)) return false;
    const int64_t numel = in.numel();
    at::Tensor dst = out.is_contiguous() ? out : at::empty(out.sizes(), out.options());
    at::Tensor flat = dst.view({-1});
    for (int q = 0; q < size_; ++q) flat.narrow(0, q * numel, numel).copy_(view(q, in.scalar_type(), numel));
    if (!dst.is_same(out)) out.copy_(dst);
    sync(in.device());
    barrier_();
    return true;
  }

 private:
  // What each rank publishes per collective: its scratch, and what it was called with, so that ranks that
  // disagree fail alike instead of reading past a peer's scratch.
  struct Record {
    std::uint32_t ok;  // 0: this rank could not export its scratch (`why`)
    std::uint32_t op;  // Op
    std::int32_t pid;
    std::int32_t arg;  // the reduce op, or the root
    std::int64_t numel;
    std::int32_t dtype;
    std::uint32_t has;  // 1: `handle` exports a scratch of `bytes`
    std::uint64_t bytes;
    std::uint64_t serial;  // changes with each new scratch of this rank
    char handle[64];
    char why[120];
  };

  static void fold(at::Tensor& acc, const at::Tensor& x, int op) {
    const bool boolean = acc.scalar_type() == at::kBool;
    switch (op) {
      case LSPAWN_ENGINE_SUM: boolean ? (void)acc.logical_or_(x) : (void)acc.add_(x); return;
      case LSPAWN_ENGINE_PRODUCT: boolean ? (void)acc.logical_and_(x) : (void)acc.mul_(x); return;
      case LSPAWN_ENGINE_MIN: at::minimum_out(acc, acc, x); return;
      case LSPAWN_ENGINE_MAX: at::maximum_out(acc, acc, x); return;
      case LSPAWN_ENGINE_BAND: acc.bitwise_and_(x); return;
      case LSPAWN_ENGINE_BOR: acc.bitwise_or_(x); return;
      case LSPAWN_ENGINE_BXOR: acc.bitwise_xor_(x); return;
      default: throw std::invalid_argument("CUDA IPC: reduction " + std::to_string(op) + " (a bug)");
    }
  }

  static void sync(c10::Device d) {
    c10::impl::VirtualGuardImpl impl(d.type());
    impl.getStream(d).synchronize();
  }

  at::Tensor view(int q, at::ScalarType type, int64_t numel) const {
    return at::from_blob(mapped_[q], {numel},
                         at::TensorOptions().dtype(type).device(
                             c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(mapped_device_[q]))));
  }

  void close(int q) {
    if (mapped_[q] != nullptr && mapped_[q] != scratch_) Cudart::get().ipc_close_mem_handle(mapped_[q]);
    mapped_[q] = nullptr;
  }
  void free_retired() {
    for (void* r : retired_) Cudart::get().free(r);
    retired_.clear();
  }

  // The scratch on `dev` holds at least `need` bytes ("" or why not).
  std::string ensure(int dev, std::size_t need) {
    const Cudart& c = Cudart::get();
    if (!c.ok()) return c.why;
    if (scratch_ != nullptr && device_ == dev && bytes_ >= need) return "";
    if (scratch_ != nullptr) {
      retired_.push_back(scratch_);  // peers map it until they open the new one (free_retired)
      scratch_ = nullptr;
      bytes_ = 0;
    }
    std::size_t size = std::size_t{1} << 20;
    while (size < need) size <<= 1;
    if (auto e = c.malloc(&scratch_, size); e != 0) {
      c.get_last_error();
      scratch_ = nullptr;
      return c.text("cudaMalloc", e) + " (" + std::to_string(size) + " bytes)";
    }
    if (auto e = c.ipc_get_mem_handle(&handle_, scratch_); e != 0) {
      c.get_last_error();
      c.free(scratch_);
      scratch_ = nullptr;
      return c.text("cudaIpcGetMemHandle", e);
    }
    device_ = dev;
    bytes_ = size;
    ++serial_;
    return "";
  }

  // Copies `src` (null: nothing to export) into the scratch, exchanges the handles, opens what changed.
  // false when some rank could not (IPC is off from then on).
  bool exchange(Op op, int arg, const at::Tensor& like, const at::Tensor* src) {
    const Cudart& c = Cudart::get();
    Record out{};
    out.ok = 1;
    out.op = static_cast<std::uint32_t>(op);
    out.pid = static_cast<std::int32_t>(::getpid());
    out.arg = arg;
    out.numel = like.numel();
    out.dtype = static_cast<std::int32_t>(like.scalar_type());
    if (src != nullptr) {
      const std::string err = ensure(src->device().index(), src->nbytes());
      if (!err.empty()) {
        out.ok = 0;
        std::strncpy(out.why, err.c_str(), sizeof out.why - 1);
      } else {
        at::from_blob(scratch_, {src->numel()}, src->options()).copy_(src->reshape({-1}));
        sync(src->device());
        out.has = 1;
        out.bytes = bytes_;
        out.serial = serial_;
        std::memcpy(out.handle, &handle_, sizeof out.handle);
      }
    }
    std::vector<Record> all(size_);
    all_gather_(&out, sizeof out, all.data());

    // Everyone must be in the same collective (the engine saw only "a Record each").
    std::string differ;
    for (int q = 0; q < size_; ++q) {
      const Record& r = all[q];
      if (r.op != all[0].op || r.arg != all[0].arg || r.numel != all[0].numel || r.dtype != all[0].dtype)
        differ += (differ.empty() ? "" : ", ") + std::to_string(shown_[q]);
    }
    if (!differ.empty())
      throw std::runtime_error("CUDA IPC: rank(s) " + differ + " called a different collective, type or size than rank " +
                               std::to_string(shown_[0]) + " (" + std::to_string(all[0].numel) + " elements of " +
                               c10::toString(static_cast<at::ScalarType>(all[0].dtype)) + ")");
    for (int q = 0; q < size_; ++q)
      if (!all[q].ok) return turn_off(q, all[q].why);

    // Open what is new; every rank sees the same records, so all agree whether anything changed.
    bool changed = false;
    std::string err;
    for (int q = 0; q < size_; ++q) {
      if (!all[q].has) continue;
      const Record& before = previous_[q];
      if (before.has && before.serial == all[q].serial && before.pid == all[q].pid) continue;
      changed = true;
      if (q == rank_) {
        mapped_[q] = scratch_;
        mapped_device_[q] = device_;
        continue;
      }
      close(q);
      if (!c.ok()) {  // a rank that exports nothing (a broadcast's non-root) has not looked for CUDA yet
        if (err.empty()) err = c.why;
        continue;
      }
      Cudart::IpcMemHandle h;
      std::memcpy(&h, all[q].handle, sizeof h);
      void* ptr = nullptr;
      if (auto e = c.ipc_open_mem_handle(&ptr, h, Cudart::kLazyEnablePeerAccess); e != 0) {
        c.get_last_error();
        if (err.empty()) err = c.text("cudaIpcOpenMemHandle", e) + " (rank " + std::to_string(shown_[q]) + "'s scratch)";
        continue;
      }
      Cudart::PointerAttributes a{};
      if (auto e = c.pointer_get_attributes(&a, ptr); e != 0) {
        c.get_last_error();
        c.ipc_close_mem_handle(ptr);
        if (err.empty()) err = c.text("cudaPointerGetAttributes", e);
        continue;
      }
      mapped_[q] = ptr;
      mapped_device_[q] = a.device;
    }
    if (changed) {  // one more exchange: did every rank open every scratch?
      Record status{};
      status.ok = err.empty() ? 1 : 0;
      std::strncpy(status.why, err.c_str(), sizeof status.why - 1);
      std::vector<Record> st(size_);
      all_gather_(&status, sizeof status, st.data());
      free_retired();  // every peer has closed its mapping of my old scratch by now
      for (int q = 0; q < size_; ++q)
        if (!st[q].ok) return turn_off(q, st[q].why);
    }
    for (int q = 0; q < size_; ++q)
      if (all[q].has) previous_[q] = all[q];
    return true;
  }

  bool turn_off(int q, const char* why) {
    off_ = true;
    why_off_ = "rank " + std::to_string(shown_[q]) + ": " + why;
    return false;
  }

  const int rank_, size_;
  const std::vector<int> shown_;
  const std::function<void(const void*, std::size_t, void*)> all_gather_;
  const std::function<void()> barrier_;
  bool off_ = false;
  std::string why_off_;
  int device_ = -1;  // of the scratch
  void* scratch_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint64_t serial_ = 0;
  Cudart::IpcMemHandle handle_{};
  std::vector<Record> previous_;    // the last exchange that succeeded: what is mapped
  std::vector<void*> mapped_;       // per rank: its scratch in this process (own: scratch_)
  std::vector<int> mapped_device_;  // the device that memory is on, in this process's numbering
  std::vector<void*> retired_;      // old scratches, freed once no peer maps them
};

}  // namespace lspawn_backend
