#include "collectives/ops.hpp"

#include "collectives/cuda_ipc.hpp"
#include "collectives/hierarchy.hpp"
#include "runtime/recorded_backend.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <time.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace lspawn {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Product: return "product";
    case ReduceOp::BitwiseAnd: return "bitwise_and";
    case ReduceOp::BitwiseOr: return "bitwise_or";
    case ReduceOp::BitwiseXor: return "bitwise_xor";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

// Op codes exchanged by checked mode (stable numbers: they appear in mismatch messages only).
enum class OpCode : std::int64_t {
  AllReduce = 1,
  Reduce,
  Broadcast,
  AllGather,
  Gather,
  Scatter,
  AllToAll,
  Send,
  Recv,
  Barrier,
};
const char* op_name(std::int64_t code) {
  switch (static_cast<OpCode>(code)) {
    case OpCode::AllReduce: return "all_reduce";
    case OpCode::Reduce: return "reduce";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::AllGather: return "all_gather";
    case OpCode::Gather: return "gather";
    case OpCode::Scatter: return "scatter";
    case OpCode::AllToAll: return "all_to_all";
    case OpCode::Send: return "send";
    case OpCode::Recv: return "recv";
    case OpCode::Barrier: return "barrier";
  }
  return "?";
}

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BitwiseAnd || op == ReduceOp::BitwiseOr || op == ReduceOp::BitwiseXor;
}

std::optional<shm::ElemType> elem_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return shm::ElemType::Float32;
    case at::kDouble: return shm::ElemType::Float64;
    case at::kHalf: return shm::ElemType::Float16;
    case at::kBFloat16: return shm::ElemType::BFloat16;
    case at::kChar: return shm::ElemType::Int8;
    case at::kByte: return shm::ElemType::UInt8;
    case at::kInt: return shm::ElemType::Int32;
    case at::kLong: return shm::ElemType::Int64;
    case at::kBool: return shm::ElemType::Bool;
    default: return std::nullopt;
  }
}

shm::KernelOp kernel_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: return shm::KernelOp::Sum;
    case ReduceOp::Min: return shm::KernelOp::Min;
    case ReduceOp::Max: return shm::KernelOp::Max;
    case ReduceOp::Product: return shm::KernelOp::Product;
    case ReduceOp::BitwiseAnd: return shm::KernelOp::BitwiseAnd;
    case ReduceOp::BitwiseOr: return shm::KernelOp::BitwiseOr;
    case ReduceOp::BitwiseXor: return shm::KernelOp::BitwiseXor;
  }
  return shm::KernelOp::Sum;
}

c10d::ReduceOp c10d_of(ReduceOp op, bool boolean) {
  if (boolean) {  // 0/1 bytes: any / all
    if (op == ReduceOp::Sum || op == ReduceOp::Max) return c10d::ReduceOp(c10d::ReduceOp::BOR);
    if (op == ReduceOp::Product || op == ReduceOp::Min) return c10d::ReduceOp(c10d::ReduceOp::BAND);
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::Min: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case ReduceOp::Max: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::Product: return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    case ReduceOp::BitwiseAnd: return c10d::ReduceOp(c10d::ReduceOp::BAND);
    case ReduceOp::BitwiseOr: return c10d::ReduceOp(c10d::ReduceOp::BOR);
    case ReduceOp::BitwiseXor: return c10d::ReduceOp(c10d::ReduceOp::BXOR);
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

void validate_reduce(Group& g, const char* op, const at::Tensor& t, ReduceOp rop) {
  const bool floating = at::isFloatingType(t.scalar_type());
  if (is_bitwise(rop) && floating)
    throw std::invalid_argument(std::string("lspawn ") + op + " on " + g.describe() + ": " + to_string(rop) +
                                " is not defined on " + std::string(c10::toString(t.scalar_type())) + " tensors");
  if (rop == ReduceOp::Mean && t.scalar_type() == at::kBool)
    throw std::invalid_argument(std::string("lspawn ") + op + " on " + g.describe() + ": mean of bool tensors");
}

void validate_root(Group& g, const char* op, int root) {
  if (root < 0 || root >= g.size())
    throw std::invalid_argument(std::string("lspawn ") + op + " on " + g.describe() + ": root rank " +
                                std::to_string(root) + " is not in [0, " + std::to_string(g.size()) + ")");
}

// Data-movement view for gloo, which has no bool or bfloat16 kernels: same bytes, gloo-known type.
at::Tensor movable(const at::Tensor& t) {
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  if (t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);  // bits only, never added
  return t;
}

// Sum then divide: true division for floating types, truncation for integers.
void apply_mean(at::Tensor& t, int size) {
  if (at::isFloatingType(t.scalar_type()))
    t.div_(size);
  else
    t.copy_(at::div(t, size, "trunc"));
}

// The end of an all_reduce, once `work` (the staged `out`) holds the sum: mean, copy back.
void finish_all_reduce(at::Tensor& work, at::Tensor& out, ReduceOp op, int size) {
  if (op == ReduceOp::Mean) apply_mean(work, size);
  if (!work.is_same(out)) out.copy_(work);
}

// The shm communicator reads and writes host memory: CPU tensors directly. CUDA tensors go device
// to device through CUDA IPC (collectives/cuda_ipc.hpp) in a LibTorch with CUDA, else (or with
// LSPAWN_SHM_CUDA_IPC=0) staged in pinned host memory (shm_staged below) — among ranks of one node
// either is faster than gloo, which stages them too and then crosses loopback TCP
// (docs/shm-backend.md#cuda-tensors).
bool use_shm(Group& g, const at::Tensor& t) {
  return g.shm() && (t.device().is_cpu() || t.device().is_cuda()) && elem_of(t.scalar_type()).has_value();
}

// A CUDA tensor through CUDA IPC rather than staged: the group has it, and the tensor is large
// enough for it to pay (CudaIpc::min_bytes(); the sizes agree on every rank, so does the choice).
bool use_cuda_ipc(Group& g, const at::Tensor& t) {
  return t.is_cuda() && g.cuda_ipc() != nullptr && t.nbytes() >= g.cuda_ipc()->min_bytes();
}

bool use_hier(Group& g, const at::Tensor& t) {
  return g.hierarchy() && t.device().is_cpu() && elem_of(t.scalar_type()).has_value();
}

// ---- hierarchical ops (collectives/hierarchy.hpp): shm inside each node, gloo between leaders.
// Each runs every stage in the calling thread; a failed stage goes to Hierarchy::fail, after which
// every op throws that failure at once (Hierarchy::check_usable).

// shm all_reduce on the node → leaders all_reduce the node results → shm broadcast from the leader.
void hier_all_reduce(Hierarchy& h, at::Tensor& work, ReduceOp op) {
  h.check_usable();
  try {
    h.local().all_reduce(work.data_ptr(), static_cast<std::size_t>(work.numel()), *elem_of(work.scalar_type()),
                         kernel_of(op));
    if (auto* leaders = h.leaders(); leaders && work.numel() > 0) {
      const bool boolean = work.scalar_type() == at::kBool;
      const bool widened = work.scalar_type() == at::kBFloat16;  // gloo has no bfloat16 sum
      at::Tensor wire = boolean ? work.view(at::kByte) : widened ? work.to(at::kFloat) : work;
      c10d::AllreduceOptions o;
      o.reduceOp = c10d_of(op, boolean);
      std::vector<at::Tensor> v{wire};
      leaders->allreduce(v, o)->wait();
      if (widened) work.copy_(wire);
    }
    h.local().broadcast(work.data_ptr(), work.nbytes(), 0);
  } catch (...) {
    h.fail(std::current_exception());
  }
}

// On the root's node: shm broadcast from the root; leaders: gloo broadcast from the root's node;
// on the other nodes: shm broadcast from the leader.
void hier_broadcast(Hierarchy& h, at::Tensor& work, int src) {
  h.check_usable();
  const NodeLayout& l = h.layout();
  const int src_node = l.node_of[src];
  const auto& src_members = l.members[src_node];
  const int src_local = static_cast<int>(std::find(src_members.begin(), src_members.end(), src) - src_members.begin());
  try {
    if (l.node == src_node) h.local().broadcast(work.data_ptr(), work.nbytes(), src_local);
    if (auto* leaders = h.leaders(); leaders && work.numel() > 0) {
      c10d::BroadcastOptions o;
      o.rootRank = src_node;
      std::vector<at::Tensor> v{movable(work)};
      leaders->broadcast(v, o)->wait();
    }
    if (l.node != src_node) h.local().broadcast(work.data_ptr(), work.nbytes(), 0);
  } catch (...) {
    h.fail(std::current_exception());
  }
}

// shm all_gather on the node → leaders all_gather the node blocks → shm broadcast of the output.
// When every node holds the same number of consecutive ranks (a world of N nodes x K), the node's
// block is its slice of the output and the leaders gather straight into the output; otherwise
// the blocks are padded to the largest node and each piece is put at its group rank.
void hier_all_gather(Hierarchy& h, const at::Tensor& in, at::Tensor& work) {
  h.check_usable();
  const NodeLayout& l = h.layout();
  const std::size_t bytes = in.nbytes();
  const int m = l.max_members();
  const auto block_bytes = static_cast<std::int64_t>(bytes) * m;
  bool regular = true;
  for (int k = 0; k < l.nodes(); ++k)
    for (int j = 0; j < m; ++j)
      regular = regular && static_cast<int>(l.members[k].size()) == m && l.members[k][j] == k * m + j;
  try {
    auto* out = static_cast<unsigned char*>(work.data_ptr());
    if (regular) {
      h.local().all_gather(in.data_ptr(), bytes, out + static_cast<std::size_t>(l.node) * block_bytes);
      if (auto* leaders = h.leaders(); leaders && bytes > 0) {
        auto blocks = work.reshape({-1}).view(at::kByte).reshape({l.nodes(), block_bytes});
        std::vector<std::vector<at::Tensor>> outs(1);
        for (int k = 0; k < l.nodes(); ++k) outs[0].push_back(blocks[k]);
        std::vector<at::Tensor> ins{blocks[l.node]};
        leaders->allgather(outs, ins)->wait();
      }
    } else {
      auto block = at::empty({block_bytes}, at::kByte);
      h.local().all_gather(in.data_ptr(), bytes, block.data_ptr());
      if (auto* leaders = h.leaders(); leaders && bytes > 0) {
        auto all = at::empty({l.nodes(), block_bytes}, at::kByte);
        std::vector<std::vector<at::Tensor>> outs(1);
        for (int k = 0; k < l.nodes(); ++k) outs[0].push_back(all[k]);
        std::vector<at::Tensor> ins{block};
        leaders->allgather(outs, ins)->wait();
        for (int k = 0; k < l.nodes(); ++k) {
          const auto* from = static_cast<const unsigned char*>(outs[0][k].data_ptr());
          for (std::size_t j = 0; j < l.members[k].size(); ++j)
            std::memcpy(out + static_cast<std::size_t>(l.members[k][j]) * bytes, from + j * bytes, bytes);
        }
      }
    }
    h.local().broadcast(out, work.nbytes(), 0);
  } catch (...) {
    h.fail(std::current_exception());
  }
}

// One op from its start: numbered, and recorded in the group's status slot (docs/hang-diagnosis.md)
// as entered; recorded as completed when the context ends (an op done now, or one that failed to
// start), or by Work::wait() once run_gloo handed it over.
// The start time only feeds error messages ("after 1.2 s"): the coarse monotonic clock (same epoch
// as steady_clock, one tick of resolution) costs ~4 ns where steady_clock::now() costs ~24 ns, a
// tenth of a 4-byte shm all_reduce.
Clock::time_point coarse_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

struct OpContext {
  // The op is recorded in the group's slot; the process group it runs on records nothing of it
  // (runtime/recorded_backend.hpp: that slot is for the ops others issue there, DDP's Reducer).
  RecordingPause own_record;
  Group& g;
  const char* op;
  std::uint64_t seq;
  Clock::time_point start;
  bool handed_over = false;  // a Work completes it
  OpContext(Group& group, const char* name, std::uint64_t bytes)
      : g(group), op(name), seq(group.next_sequence()), start(coarse_now()) {
    g.status_slot().enter(op, seq, bytes);
  }
  OpContext(const OpContext&) = delete;
  OpContext& operator=(const OpContext&) = delete;
  ~OpContext() {
    if (!handed_over) g.status_slot().complete(seq);
  }
};

std::uint64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<std::uint64_t>(t.nbytes()) : 0; }

// Runs `fn` now (shm, or purely local); translates failures. Returns a complete Work.
template <typename Fn>
Work run_now(const OpContext& c, Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument&) {
    throw;
  } catch (...) {
    throw_collective_error(c.g, c.op, c.seq, c.start, std::current_exception());
  }
  return Work();
}

// Starts a gloo op; `finish` runs in wait().
template <typename Start>
Work run_gloo(OpContext& c, Start&& start, std::function<void()> finish) {
  auto p = std::make_shared<Work::Pending>();
  p->group = &c.g;
  p->op = c.op;
  p->sequence = c.seq;
  p->start = c.start;
  try {
    p->work = start();
  } catch (...) {
    throw_collective_error(c.g, c.op, c.seq, c.start, std::current_exception());
  }
  p->finish = std::move(finish);
  p->status = c.g.status_slot();
  c.handed_over = true;
  return Work(p);
}

// Checked mode: every rank publishes (op, sequence, dtype, numel, ndim, shape hash, root, reduce
// op) with one small gloo all_gather and compares. Throws CollectiveMismatch naming the ranks.
void check_call(const OpContext& c, OpCode code, const at::Tensor* t, int root, int rop) {
  Group& g = c.g;
  if (!g.checked() || g.size() == 1) return;
  std::uint64_t shape_hash = 1469598103934665603ULL;  // FNV-1a over the sizes (unsigned: wraps)
  std::int64_t dtype = -1, numel = -1, ndim = -1;
  if (t && t->defined()) {
    dtype = static_cast<std::int64_t>(t->scalar_type());
    numel = t->numel();
    ndim = t->dim();
    for (auto s : t->sizes()) shape_hash = (shape_hash ^ static_cast<std::uint64_t>(s)) * 1099511628211ULL;
  }
  const std::int64_t mine[8] = {static_cast<std::int64_t>(code),
                                static_cast<std::int64_t>(c.seq),
                                dtype,
                                numel,
                                ndim,
                                static_cast<std::int64_t>(shape_hash),
                                root,
                                rop};
  auto in = at::from_blob(const_cast<std::int64_t*>(mine), {8}, at::kLong).clone();
  auto out = at::empty({g.size(), 8}, at::kLong);
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int q = 0; q < g.size(); ++q) outs[0].push_back(out[q]);
  std::vector<at::Tensor> ins{in};
  try {
    g.process_group()->allgather(outs, ins)->wait();
  } catch (...) {
    throw_collective_error(g, c.op, c.seq, c.start, std::current_exception());
  }
  auto a = out.accessor<std::int64_t, 2>();
  std::vector<int> odd;
  for (int q = 1; q < g.size(); ++q)
    for (int k = 0; k < 8; ++k)
      if (a[q][k] != a[0][k]) {
        odd.push_back(q);
        break;
      }
  if (odd.empty()) return;
  std::ostringstream msg;
  msg << "lspawn " << c.op << " (op #" << c.seq << ") on " << g.describe() << ": collective mismatch: ";
  for (int q = 0; q < g.size(); ++q) {
    msg << (q ? "; " : "") << "rank " << q << " called " << op_name(a[q][0]) << " #" << a[q][1];
    if (a[q][2] >= 0)
      msg << " (" << c10::toString(static_cast<at::ScalarType>(a[q][2])) << ", " << a[q][3] << " elements, " << a[q][4]
          << " dims)";
    if (a[q][6] >= 0) msg << " root " << a[q][6];
  }
  msg << "; ranks differing from rank 0:";
  for (int q : odd) msg << " " << q;
  throw CollectiveMismatch(c.op, g.name(), odd, msg.str());
}

void require_shape(Group& g, const char* op, const char* what, const at::Tensor& t, std::vector<int64_t> shape,
                   at::ScalarType dtype) {
  if (!t.defined() || t.sizes().vec() != shape || t.scalar_type() != dtype) {
    std::ostringstream s;
    s << "lspawn " << op << " on " << g.describe() << ": " << what << " must be " << c10::toString(dtype)
      << " of shape " << at::IntArrayRef(shape) << ", got ";
    if (t.defined())
      s << c10::toString(t.scalar_type()) << " " << t.sizes();
    else
      s << "an undefined tensor";
    throw std::invalid_argument(s.str());
  }
}

std::vector<int64_t> stacked_shape(int size, const at::Tensor& t) {
  std::vector<int64_t> s{size};
  for (auto d : t.sizes()) s.push_back(d);
  return s;
}

// Staging: a contiguous tensor to work on, copied back into `t` by finish when it is a copy.
at::Tensor staged(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Staging for the shm path: staged(t) for a CPU tensor; for a CUDA tensor, a contiguous tensor of
// its shape in pinned host memory (the caching host allocator keeps the blocks between ops),
// holding t's values when `fill` (the op reads them), uninitialised otherwise (an output). The op
// copies it back into t as it does any staged copy (`!work.is_same(t)`).
at::Tensor shm_staged(const at::Tensor& t, bool fill) {
  if (t.device().is_cpu()) return staged(t);
  auto host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  if (fill) host.copy_(t);
  return host;
}

}  // namespace

// ---- all_reduce ------------------------------------------------------------------------------

Work all_reduce_async(Group& g, at::Tensor& tensor, ReduceOp op) {
  validate_reduce(g, "all_reduce", tensor, op);
  OpContext c(g, "all_reduce", bytes_of(tensor));
  const int size = g.size();
  if (use_shm(g, tensor)) {  // first, and without the copies of tensor handles the others need
    return run_now(c, [&] {
      if (use_cuda_ipc(g, tensor) && g.cuda_ipc()->all_reduce(tensor, op)) {
        finish_all_reduce(tensor, tensor, op, size);  // the mean, on the device
        return;
      }
      at::Tensor work = shm_staged(tensor, true);
      g.shm()->all_reduce(work.data_ptr(), static_cast<std::size_t>(work.numel()), *elem_of(work.scalar_type()),
                          kernel_of(op));
      finish_all_reduce(work, tensor, op, size);
    });
  }
  at::Tensor t = tensor;
  at::Tensor work = staged(t);
  auto finish = [t, work, op, size]() mutable { finish_all_reduce(work, t, op, size); };
  check_call(c, OpCode::AllReduce, &work, -1, static_cast<int>(op));
  if (use_hier(g, work)) {
    return run_now(c, [&] {
      hier_all_reduce(*g.hierarchy(), work, op);
      finish();
    });
  }
  if (work.numel() == 0 || size == 1) return run_now(c, finish);
  const bool boolean = work.scalar_type() == at::kBool;
  at::Tensor wire = work;
  if (boolean) wire = work.view(at::kByte);
  if (work.scalar_type() == at::kBFloat16) wire = work.to(at::kFloat);  // gloo has no bfloat16 sum
  const bool widened = !wire.is_same(work) && !boolean;
  c10d::AllreduceOptions o;
  o.reduceOp = c10d_of(op, boolean);
  return run_gloo(
      c,
      [&] {
        std::vector<at::Tensor> v{wire};
        return g.process_group()->allreduce(v, o);
      },
      [finish, work, wire, widened]() mutable {
        if (widened) work.copy_(wire);
        finish();
      });
}

void all_reduce(Group& g, at::Tensor& tensor, ReduceOp op) { all_reduce_async(g, tensor, op).wait(); }

Work all_reduce_coalesced_async(Group& g, std::vector<at::Tensor>& tensors, ReduceOp op) {
  if (tensors.empty()) return Work();
  for (const auto& t : tensors)
    if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device())
      throw std::invalid_argument("lspawn all_reduce_coalesced on " + g.describe() +
                                  ": all tensors must share one dtype and device");
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  auto buffer = at::cat(flat);
  auto inner = std::make_shared<Work>(all_reduce_async(g, buffer, op));
  auto p = std::make_shared<Work::Pending>();
  p->group = &g;
  p->op = "all_reduce_coalesced";
  p->start = Clock::now();
  std::vector<at::Tensor> outs = tensors;
  p->finish = [inner, buffer, outs]() mutable {
    inner->wait();
    std::int64_t off = 0;
    for (auto& t : outs) {
      const auto n = t.numel();
      t.copy_(buffer.narrow(0, off, n).view(t.sizes()));
      off += n;
    }
  };
  return Work(p);
}

void all_reduce_coalesced(Group& g, std::vector<at::Tensor>& tensors, ReduceOp op) {
  all_reduce_coalesced_async(g, tensors, op).wait();
}

// ---- reduce ----------------------------------------------------------------------------------

Work reduce_async(Group& g, at::Tensor& tensor, int dst, ReduceOp op) {
  validate_root(g, "reduce", dst);
  validate_reduce(g, "reduce", tensor, op);
  if (use_shm(g, tensor) || use_hier(g, tensor)) {
    // Over shm, an all_reduce costs what a reduce costs (every rank folds its region); across
    // nodes, the hierarchy's all_reduce is a reduce plus broadcasts that are cheap next to it.
    auto tmp = tensor.contiguous().clone();
    all_reduce_async(g, tmp, op).wait();
    if (g.rank() == dst) tensor.copy_(tmp);
    return Work();
  }
  OpContext c(g, "reduce", bytes_of(tensor));
  at::Tensor t = tensor;
  at::Tensor work = staged(t);
  const bool copy_back = !work.is_same(t);
  const bool root = g.rank() == dst;
  const int size = g.size();
  check_call(c, OpCode::Reduce, &work, dst, static_cast<int>(op));
  auto finish = [t, work, copy_back, op, size, root]() mutable {
    if (!root) return;
    if (op == ReduceOp::Mean) apply_mean(work, size);
    if (copy_back) t.copy_(work);
  };
  if (work.numel() == 0 || size == 1) return run_now(c, finish);
  const bool boolean = work.scalar_type() == at::kBool;
  at::Tensor wire = boolean ? work.view(at::kByte) : work;
  if (work.scalar_type() == at::kBFloat16) wire = work.to(at::kFloat);
  const bool widened = work.scalar_type() == at::kBFloat16;
  c10d::ReduceOptions o;
  o.reduceOp = c10d_of(op, boolean);
  o.rootRank = dst;
  return run_gloo(
      c,
      [&] {
        std::vector<at::Tensor> v{wire};
        return g.process_group()->reduce(v, o);
      },
      [finish, work, wire, widened, root]() mutable {
        if (widened && root) work.copy_(wire);
        finish();
      });
}

void reduce(Group& g, at::Tensor& tensor, int dst, ReduceOp op) { reduce_async(g, tensor, dst, op).wait(); }

// ---- broadcast -------------------------------------------------------------------------------

Work broadcast_async(Group& g, at::Tensor& tensor, int src) {
  validate_root(g, "broadcast", src);
  OpContext c(g, "broadcast", bytes_of(tensor));
  at::Tensor t = tensor;
  if (use_shm(g, t)) {
    return run_now(c, [&] {
      if (use_cuda_ipc(g, t)) {
        at::Tensor work = staged(t);
        if (g.cuda_ipc()->broadcast(work, src)) {
          if (!work.is_same(t) && g.rank() != src) t.copy_(work);
          return;
        }
      }
      at::Tensor work = shm_staged(t, g.rank() == src);
      g.shm()->broadcast(work.data_ptr(), work.nbytes(), src);
      if (!work.is_same(t) && g.rank() != src) t.copy_(work);
    });
  }
  at::Tensor work = staged(t);
  const bool copy_back = !work.is_same(t) && g.rank() != src;
  auto finish = [t, work, copy_back]() mutable {
    if (copy_back) t.copy_(work);
  };
  check_call(c, OpCode::Broadcast, &work, src, -1);
  if (use_hier(g, work)) {
    return run_now(c, [&] {
      hier_broadcast(*g.hierarchy(), work, src);
      finish();
    });
  }
  if (work.numel() == 0 || g.size() == 1) return run_now(c, finish);
  c10d::BroadcastOptions o;
  o.rootRank = src;
  at::Tensor wire = movable(work);
  return run_gloo(
      c,
      [&] {
        std::vector<at::Tensor> v{wire};
        return g.process_group()->broadcast(v, o);
      },
      finish);
}

void broadcast(Group& g, at::Tensor& tensor, int src) { broadcast_async(g, tensor, src).wait(); }

// ---- all_gather ------------------------------------------------------------------------------

Work all_gather_async(Group& g, const at::Tensor& input, at::Tensor& output) {
  require_shape(g, "all_gather", "output", output, stacked_shape(g.size(), input), input.scalar_type());
  OpContext c(g, "all_gather", bytes_of(input));
  at::Tensor out = output;
  if (use_shm(g, input) && output.device() == input.device()) {
    return run_now(c, [&] {
      if (use_cuda_ipc(g, input)) {
        at::Tensor work = staged(out);
        if (g.cuda_ipc()->all_gather(input, work)) {
          if (!work.is_same(out)) out.copy_(work);
          return;
        }
      }
      at::Tensor in = shm_staged(input, true);
      at::Tensor work = shm_staged(out, false);
      g.shm()->all_gather(in.data_ptr(), in.nbytes(), work.data_ptr());
      if (!work.is_same(out)) out.copy_(work);
    });
  }
  at::Tensor in = staged(input);
  at::Tensor work = staged(out);
  const bool copy_back = !work.is_same(out);
  auto finish = [out, work, copy_back]() mutable {
    if (copy_back) out.copy_(work);
  };
  check_call(c, OpCode::AllGather, &in, -1, -1);
  if (use_hier(g, in)) {
    return run_now(c, [&] {
      hier_all_gather(*g.hierarchy(), in, work);
      finish();
    });
  }
  if (in.numel() == 0) return run_now(c, finish);
  if (g.size() == 1)
    return run_now(c, [&] {
      work[0].copy_(in);
      finish();
    });
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int q = 0; q < g.size(); ++q) outs[0].push_back(movable(work[q]));
  std::vector<at::Tensor> ins{movable(in)};
  return run_gloo(
      c, [&] { return g.process_group()->allgather(outs, ins); }, finish);
}

at::Tensor all_gather(Group& g, const at::Tensor& input) {
  auto out = at::empty(stacked_shape(g.size(), input), input.options());
  all_gather_async(g, input, out).wait();
  return out;
}

std::vector<at::Tensor> all_gather_list(Group& g, const at::Tensor& input) { return all_gather(g, input).unbind(0); }

// ---- gather / scatter (gloo) -----------------------------------------------------------------

Work gather_async(Group& g, const at::Tensor& input, at::Tensor& output, int dst) {
  validate_root(g, "gather", dst);
  const bool root = g.rank() == dst;
  if (root) require_shape(g, "gather", "output", output, stacked_shape(g.size(), input), input.scalar_type());
  OpContext c(g, "gather", bytes_of(input));
  at::Tensor in = staged(input);
  at::Tensor out = root ? output : at::Tensor();
  at::Tensor work = root ? staged(out) : at::Tensor();
  const bool copy_back = root && !work.is_same(out);
  auto finish = [out, work, copy_back]() mutable {
    if (copy_back) out.copy_(work);
  };
  check_call(c, OpCode::Gather, &in, dst, -1);
  if (g.size() == 1)
    return run_now(c, [&] {
      work[0].copy_(in);
      finish();
    });
  if (in.numel() == 0) return run_now(c, finish);
  std::vector<std::vector<at::Tensor>> outs;
  if (root) {
    outs.emplace_back();
    for (int q = 0; q < g.size(); ++q) outs[0].push_back(movable(work[q]));
  }
  std::vector<at::Tensor> ins{movable(in)};
  c10d::GatherOptions o;
  o.rootRank = dst;
  return run_gloo(
      c, [&] { return g.process_group()->gather(outs, ins, o); }, finish);
}

void gather(Group& g, const at::Tensor& input, at::Tensor& output, int dst) {
  gather_async(g, input, output, dst).wait();
}

Work scatter_async(Group& g, at::Tensor& output, const at::Tensor& input, int src) {
  validate_root(g, "scatter", src);
  const bool root = g.rank() == src;
  if (root) require_shape(g, "scatter", "input", input, stacked_shape(g.size(), output), output.scalar_type());
  OpContext c(g, "scatter", bytes_of(output));
  at::Tensor out = output;
  at::Tensor work = staged(out);
  const bool copy_back = !work.is_same(out);
  at::Tensor in = root ? staged(input) : at::Tensor();
  auto finish = [out, work, copy_back]() mutable {
    if (copy_back) out.copy_(work);
  };
  check_call(c, OpCode::Scatter, &work, src, -1);
  if (g.size() == 1)
    return run_now(c, [&] {
      work.copy_(in[0]);
      finish();
    });
  if (work.numel() == 0) return run_now(c, finish);
  std::vector<std::vector<at::Tensor>> ins;
  if (root) {
    ins.emplace_back();
    for (int q = 0; q < g.size(); ++q) ins[0].push_back(movable(in[q]));
  }
  std::vector<at::Tensor> outs{movable(work)};
  c10d::ScatterOptions o;
  o.rootRank = src;
  return run_gloo(
      c, [&] { return g.process_group()->scatter(outs, ins, o); }, finish);
}

void scatter(Group& g, at::Tensor& output, const at::Tensor& input, int src) {
  scatter_async(g, output, input, src).wait();
}

// ---- reduce_scatter (all_reduce + own slice: gloo 1.13 has no reduce_scatter) -----------------

Work reduce_scatter_async(Group& g, at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  require_shape(g, "reduce_scatter", "input", input, stacked_shape(g.size(), output), output.scalar_type());
  auto buffer = input.contiguous().clone();
  auto inner = std::make_shared<Work>(all_reduce_async(g, buffer, op));
  auto p = std::make_shared<Work::Pending>();
  p->group = &g;
  p->op = "reduce_scatter";
  p->start = Clock::now();
  at::Tensor out = output;
  const int rank = g.rank();
  p->finish = [inner, buffer, out, rank]() mutable {
    inner->wait();
    out.copy_(buffer[rank]);
  };
  return Work(p);
}

void reduce_scatter(Group& g, at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  reduce_scatter_async(g, output, input, op).wait();
}

// ---- all_to_all (gloo) -----------------------------------------------------------------------

Work all_to_all_async(Group& g, at::Tensor& output, const at::Tensor& input) {
  if (input.dim() == 0 || input.size(0) % g.size() != 0)
    throw std::invalid_argument("lspawn all_to_all on " + g.describe() + ": input dim 0 (" +
                                (input.dim() ? std::to_string(input.size(0)) : std::string("scalar")) +
                                ") must be divisible by the group size");
  require_shape(g, "all_to_all", "output", output, input.sizes().vec(), input.scalar_type());
  OpContext c(g, "all_to_all", bytes_of(input));
  at::Tensor in = staged(input);
  at::Tensor out = output;
  at::Tensor work = staged(out);
  const bool copy_back = !work.is_same(out);
  auto finish = [out, work, copy_back]() mutable {
    if (copy_back) out.copy_(work);
  };
  check_call(c, OpCode::AllToAll, &in, -1, -1);
  if (g.size() == 1)
    return run_now(c, [&] {
      work.copy_(in);
      finish();
    });
  if (in.numel() == 0) return run_now(c, finish);
  at::Tensor wire_out = movable(work), wire_in = movable(in);
  return run_gloo(
      c,
      [&] {
        std::vector<int64_t> none;
        return g.process_group()->alltoall_base(wire_out, wire_in, none, none);
      },
      finish);
}

void all_to_all(Group& g, at::Tensor& output, const at::Tensor& input) { all_to_all_async(g, output, input).wait(); }

// ---- send / recv (gloo) ----------------------------------------------------------------------

Work send_async(Group& g, const at::Tensor& tensor, int dst, int tag) {
  validate_root(g, "send", dst);
  OpContext c(g, "send", bytes_of(tensor));
  at::Tensor work = staged(tensor);
  if (work.numel() == 0) return Work();
  return run_gloo(
      c,
      [&] {
        std::vector<at::Tensor> v{movable(work)};
        return g.process_group()->send(v, dst, tag);
      },
      [work] {});
}

void send(Group& g, const at::Tensor& tensor, int dst, int tag) { send_async(g, tensor, dst, tag).wait(); }

Work recv_async(Group& g, at::Tensor& tensor, int src, int tag) {
  validate_root(g, "recv", src);
  OpContext c(g, "recv", bytes_of(tensor));
  at::Tensor t = tensor;
  at::Tensor work = staged(t);
  const bool copy_back = !work.is_same(t);
  if (work.numel() == 0) return Work();
  return run_gloo(
      c,
      [&] {
        std::vector<at::Tensor> v{movable(work)};
        return g.process_group()->recv(v, src, tag);
      },
      [t, work, copy_back]() mutable {
        if (copy_back) t.copy_(work);
      });
}

void recv(Group& g, at::Tensor& tensor, int src, int tag) { recv_async(g, tensor, src, tag).wait(); }

// ---- barrier ---------------------------------------------------------------------------------

Work barrier_async(Group& g) {
  OpContext c(g, "barrier", 0);
  if (g.shm()) return run_now(c, [&] { g.shm()->barrier(); });
  check_call(c, OpCode::Barrier, nullptr, -1, -1);
  if (g.size() == 1) return Work();
  return run_gloo(
      c, [&] { return g.process_group()->barrier(); }, nullptr);
}

void barrier(Group& g) { barrier_async(g).wait(); }

}  // namespace lspawn
