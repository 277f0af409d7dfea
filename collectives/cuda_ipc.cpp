#include "collectives/cuda_ipc.hpp"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

#ifdef LSPAWN_HAVE_CUDA_IPC
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>
#endif

namespace lspawn {

bool CudaIpc::available() {
#ifdef LSPAWN_HAVE_CUDA_IPC
  const char* v = std::getenv("LSPAWN_SHM_CUDA_IPC");
  if (v == nullptr || *v == '\0' || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  throw std::invalid_argument(std::string("LSPAWN_SHM_CUDA_IPC='") + v +
                              "': expected 1 (CUDA tensors device to device through CUDA IPC) or 0 (staged "
                              "through host memory)");
#else
  return false;
#endif
}

#ifdef LSPAWN_HAVE_CUDA_IPC
namespace {
std::size_t min_bytes_from_env(std::size_t fallback) {
  const char* v = std::getenv("LSPAWN_SHM_CUDA_IPC_MIN_BYTES");
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*v == '-' || end == v || *end != '\0' || errno == ERANGE)
    throw std::invalid_argument(
        std::string("LSPAWN_SHM_CUDA_IPC_MIN_BYTES='") + v +
        "': expected a byte count (CUDA tensors of fewer bytes are staged through host memory)");
  return static_cast<std::size_t>(n);
}
}  // namespace
#endif

void CudaIpc::check_environment() {
#ifdef LSPAWN_HAVE_CUDA_IPC
  if (available()) (void)min_bytes_from_env(0);
#endif
}

#ifndef LSPAWN_HAVE_CUDA_IPC

struct CudaIpc::Peers {};
CudaIpc::CudaIpc(shm::Communicator& comm) : comm_(comm) {
  off_ = true;
  why_off_ = "this LibTorch has no CUDA";
}
CudaIpc::~CudaIpc() = default;
bool CudaIpc::all_reduce(at::Tensor&, ReduceOp) { return false; }
bool CudaIpc::broadcast(at::Tensor&, int) { return false; }
bool CudaIpc::all_gather(const at::Tensor&, at::Tensor&) { return false; }
bool CudaIpc::exchange(const at::Tensor*) { return false; }
at::Tensor CudaIpc::view(int, at::ScalarType, int64_t) const { return at::Tensor(); }

#else

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t is 64 bytes");

// What each rank publishes per collective (all_gather through shm): its scratch, and what it was
// called with, so that ranks that disagree fail alike instead of reading past a peer's scratch.
struct Record {
  std::uint32_t ok;  // 0: this rank could not export its scratch (`why`)
  std::uint32_t op;  // 1 all_reduce, 2 broadcast, 3 all_gather
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

std::string cuda_text(const char* call, cudaError_t e) { return std::string(call) + ": " + cudaGetErrorString(e); }

void sync(c10::Device d) { c10::cuda::getCurrentCUDAStream(d.index()).synchronize(); }

void fold(at::Tensor& acc, const at::Tensor& x, ReduceOp op) {
  const bool boolean = acc.scalar_type() == at::kBool;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: boolean ? (void)acc.logical_or_(x) : (void)acc.add_(x); return;
    case ReduceOp::Product: boolean ? (void)acc.logical_and_(x) : (void)acc.mul_(x); return;
    case ReduceOp::Min: at::minimum_out(acc, acc, x); return;
    case ReduceOp::Max: at::maximum_out(acc, acc, x); return;
    case ReduceOp::BitwiseAnd: acc.bitwise_and_(x); return;
    case ReduceOp::BitwiseOr: acc.bitwise_or_(x); return;
    case ReduceOp::BitwiseXor: acc.bitwise_xor_(x); return;
  }
}

}  // namespace

struct CudaIpc::Peers {
  int device = -1;  // of the scratch
  void* scratch = nullptr;
  std::size_t bytes = 0;
  std::uint64_t serial = 0;
  cudaIpcMemHandle_t handle{};
  std::vector<Record> records;     // this collective's exchange
  std::vector<Record> previous;    // the last one that succeeded: what is mapped
  std::vector<void*> mapped;       // per rank: its scratch in this process (own: `scratch`)
  std::vector<int> mapped_device;  // the device that memory is on, in this process's numbering

  // The scratch on `device` holds at least `need` bytes ("" or why not).
  std::string ensure(int dev, std::size_t need) {
    if (scratch != nullptr && device == dev && bytes >= need) return "";
    if (scratch != nullptr) {
      retired.push_back(scratch);  // peers map it until they open the new one (free_retired)
      scratch = nullptr;
      bytes = 0;
    }
    std::size_t size = std::size_t{1} << 20;
    while (size < need) size <<= 1;
    if (auto e = cudaMalloc(&scratch, size); e != cudaSuccess) {
      cudaGetLastError();
      scratch = nullptr;
      return cuda_text("cudaMalloc", e) + " (" + std::to_string(size) + " bytes)";
    }
    if (auto e = cudaIpcGetMemHandle(&handle, scratch); e != cudaSuccess) {
      cudaGetLastError();
      cudaFree(scratch);
      scratch = nullptr;
      return cuda_text("cudaIpcGetMemHandle", e);
    }
    device = dev;
    bytes = size;
    ++serial;
    return "";
  }

  std::vector<void*> retired;  // old scratches, freed once no peer maps them

  void free_retired() {
    for (void* r : retired) cudaFree(r);
    retired.clear();
  }

  void close(int q) {
    if (mapped[q] != nullptr && mapped[q] != scratch) cudaIpcCloseMemHandle(mapped[q]);
    mapped[q] = nullptr;
  }
};

CudaIpc::CudaIpc(shm::Communicator& comm) : comm_(comm), peers_(std::make_unique<Peers>()) {
  min_bytes_ = min_bytes_from_env(min_bytes_);
  const int n = comm_.size();
  peers_->records.resize(n);
  peers_->previous.resize(n);
  peers_->mapped.assign(n, nullptr);
  peers_->mapped_device.assign(n, -1);
}

CudaIpc::~CudaIpc() {
  // At process exit CUDA may be torn down already: errors are ignored.
  for (int q = 0; q < comm_.size(); ++q) peers_->close(q);
  if (peers_->scratch != nullptr) cudaFree(peers_->scratch);
  peers_->free_retired();
  cudaGetLastError();
}

at::Tensor CudaIpc::view(int rank, at::ScalarType type, int64_t numel) const {
  const int dev = peers_->mapped_device[rank];
  return at::from_blob(
      peers_->mapped[rank], {numel},
      at::TensorOptions().dtype(type).device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(dev))));
}

bool CudaIpc::exchange(const at::Tensor* src) {
  Peers& p = *peers_;
  const int n = comm_.size(), me = comm_.rank();
  Record& mine = p.records[me];
  Record out = mine;  // op, arg, numel, dtype: set by the caller
  out.ok = 1;
  out.pid = static_cast<std::int32_t>(::getpid());
  out.has = 0;
  std::memset(out.why, 0, sizeof out.why);
  if (src != nullptr) {
    const std::string err = p.ensure(src->device().index(), src->nbytes());
    if (!err.empty()) {
      out.ok = 0;
      std::strncpy(out.why, err.c_str(), sizeof out.why - 1);
    } else {
      at::from_blob(p.scratch, {src->numel()}, src->options()).copy_(src->reshape({-1}));
      sync(src->device());
      out.has = 1;
      out.bytes = p.bytes;
      out.serial = p.serial;
      std::memcpy(out.handle, &p.handle, sizeof out.handle);
    }
  }
  std::vector<Record> all(n);
  comm_.all_gather(&out, sizeof out, all.data());
  p.records = all;

  // Everyone must be in the same collective (the shm descriptor saw only "80 bytes each").
  std::vector<int> differ;
  for (int q = 0; q < n; ++q) {
    const Record& r = all[q];
    if (r.op != all[0].op || r.arg != all[0].arg || r.numel != all[0].numel || r.dtype != all[0].dtype)
      differ.push_back(q);
  }
  if (!differ.empty()) {
    std::string who;
    for (int q : differ) who += (who.empty() ? "" : ", ") + std::to_string(q);
    throw shm::Error(shm::Error::Kind::Mismatch, differ,
                     "CUDA IPC: rank(s) " + who + " called a different collective, type or size than rank 0 (" +
                         std::to_string(all[0].numel) + " elements of " +
                         c10::toString(static_cast<at::ScalarType>(all[0].dtype)) + ")");
  }
  for (int q = 0; q < n; ++q) {
    if (!all[q].ok) {
      off_ = true;
      why_off_ = "rank " + std::to_string(q) + ": " + all[q].why;
      return false;
    }
  }

  // Open what is new; every rank sees the same records, so all agree whether anything changed.
  bool changed = false;
  std::string err;
  for (int q = 0; q < n; ++q) {
    if (!all[q].has) continue;
    const Record& before = p.previous[q];
    if (before.has && before.serial == all[q].serial && before.pid == all[q].pid) continue;
    changed = true;
    if (q == me) {
      p.mapped[q] = p.scratch;
      p.mapped_device[q] = p.device;
      continue;
    }
    p.close(q);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, all[q].handle, sizeof h);
    void* ptr = nullptr;
    if (auto e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
      cudaGetLastError();
      if (err.empty()) err = cuda_text("cudaIpcOpenMemHandle", e) + " (rank " + std::to_string(q) + "'s scratch)";
      continue;
    }
    cudaPointerAttributes a{};
    if (auto e = cudaPointerGetAttributes(&a, ptr); e != cudaSuccess) {
      cudaGetLastError();
      cudaIpcCloseMemHandle(ptr);
      if (err.empty()) err = cuda_text("cudaPointerGetAttributes", e);
      continue;
    }
    p.mapped[q] = ptr;
    p.mapped_device[q] = a.device;
  }
  if (changed) {  // one more exchange: did every rank open every scratch?
    Record status{};
    status.ok = err.empty() ? 1 : 0;
    std::strncpy(status.why, err.c_str(), sizeof status.why - 1);
    std::vector<Record> st(n);
    comm_.all_gather(&status, sizeof status, st.data());
    p.free_retired();  // every peer has closed its mapping of my old scratch by now
    for (int q = 0; q < n; ++q) {
      if (!st[q].ok) {
        off_ = true;
        why_off_ = "rank " + std::to_string(q) + ": " + st[q].why;
        return false;
      }
    }
  }
  for (int q = 0; q < n; ++q)
    if (all[q].has) p.previous[q] = all[q];
  return true;
}

bool CudaIpc::all_reduce(at::Tensor& t, ReduceOp op) {
  if (off_) return false;
  if (t.numel() == 0) return true;
  c10::cuda::CUDAGuard guard(t.device());
  at::Tensor work = t.is_contiguous() ? t : t.contiguous();
  Record& r = peers_->records[comm_.rank()];
  r.op = 1;
  r.arg = static_cast<std::int32_t>(op);
  r.numel = work.numel();
  r.dtype = static_cast<std::int32_t>(work.scalar_type());
  if (!exchange(&work)) return false;
  const int n = comm_.size(), me = comm_.rank();
  const int64_t numel = work.numel();
  const auto type = work.scalar_type();
  const c10::Device dev = work.device();
  auto lo = [&](int q) { return numel * q / n; };
  // Reduce-scatter: range `me` of every scratch, folded in rank order, into my scratch.
  if (const int64_t len = lo(me + 1) - lo(me); len > 0) {
    at::Tensor acc = view(0, type, numel).narrow(0, lo(me), len).to(dev, type, false, /*copy=*/true);
    for (int q = 1; q < n; ++q) fold(acc, view(q, type, numel).narrow(0, lo(me), len).to(dev), op);
    view(me, type, numel).narrow(0, lo(me), len).copy_(acc);
  }
  sync(dev);
  comm_.barrier();
  // All-gather: range q from rank q's scratch.
  at::Tensor flat = work.view({-1});
  for (int q = 0; q < n; ++q) {
    if (const int64_t len = lo(q + 1) - lo(q); len > 0)
      flat.narrow(0, lo(q), len).copy_(view(q, type, numel).narrow(0, lo(q), len));
  }
  if (!work.is_same(t)) t.copy_(work);
  sync(dev);
  comm_.barrier();  // nobody writes its scratch again while a peer still reads it
  return true;
}

bool CudaIpc::broadcast(at::Tensor& t, int root) {
  if (off_) return false;
  if (t.numel() == 0) return true;
  c10::cuda::CUDAGuard guard(t.device());
  Record& r = peers_->records[comm_.rank()];
  r.op = 2;
  r.arg = root;
  r.numel = t.numel();
  r.dtype = static_cast<std::int32_t>(t.scalar_type());
  if (!exchange(comm_.rank() == root ? &t : nullptr)) return false;
  if (comm_.rank() != root) t.view({-1}).copy_(view(root, t.scalar_type(), t.numel()));
  sync(t.device());
  comm_.barrier();
  return true;
}

bool CudaIpc::all_gather(const at::Tensor& in, at::Tensor& out) {
  if (off_) return false;
  if (in.numel() == 0) return true;
  c10::cuda::CUDAGuard guard(in.device());
  Record& r = peers_->records[comm_.rank()];
  r.op = 3;
  r.arg = 0;
  r.numel = in.numel();
  r.dtype = static_cast<std::int32_t>(in.scalar_type());
  if (!exchange(&in)) return false;
  const int64_t numel = in.numel();
  at::Tensor flat = out.view({-1});
  for (int q = 0; q < comm_.size(); ++q) flat.narrow(0, q * numel, numel).copy_(view(q, in.scalar_type(), numel));
  sync(in.device());
  comm_.barrier();
  return true;
}

#endif  // LSPAWN_HAVE_CUDA_IPC

}  // namespace lspawn
