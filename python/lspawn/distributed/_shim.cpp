// The torch.distributed backend `lspawn`, for one torch release: a c10d Backend (torch 2.x) or
// ProcessGroup (torch 1.13) whose collectives on tensors of one host go through lspawn's engine
// (liblspawn_engine.so, shm/engine.h: the shared-memory communicator), and whose other work
// goes to a gloo backend of the same group (docs/python-backend.md, "What runs where").
//
// Built per torch release, against its headers, C++ ABI and pybind11 settings, by
// lspawn/distributed/_build.py (`python -m lspawn.distributed build`); the wheel ships the builds
// of the releases CI tests. The engine's C symbols are resolved at load from the engine that
// lspawn.distributed loads first (RTLD_GLOBAL), so no C++ type crosses between them.
//
// CUDA tensors: device to device through CUDA IPC in a group on one host (all_reduce, reduce, broadcast, the
// all_gathers, reduce_scatter_tensor; _cuda_ipc.h), every other op and every smaller tensor staged through
// host memory.
//
// Every operation is either carried by the engine (synchronously, in the calling thread: the
// Work it returns is complete, its future holds the outputs), handed whole to the gloo backend,
// or refused with an error naming the operation and the backend to use instead. Never a partial
// or wrong result.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if LSPAWN_TORCH2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/utils/pybind.h>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "_cuda_ipc.h"

namespace lspawn_backend {

#if LSPAWN_TORCH2
using Base = c10d::Backend;
#else
using Base = c10d::ProcessGroup;
#endif
using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

// The Work of every op the engine runs: its future holds the outputs, or the error. Completed before it is
// returned when the op ran in the caller's thread (run()), later when it ran on the runner (run_async()).
// With CUDA outputs the future is one of their devices, as gloo's and NCCL's are: completing it records an
// event on each one's current stream, which a callback's or waiter's stream then waits for (a CPU future
// would hand CUDA tensors to `then` callbacks with no synchronisation at all).
class FutureWork final : public Work {
 public:
  FutureWork(c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(-1, type), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(list_type(), devices_of(outputs_))) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    {  // not future_->wait(): see Runner::kTick
      std::unique_lock<std::mutex> l(mu_);
      while (!finished_) cv_.wait_for(l, std::chrono::seconds(1));
    }
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void done() {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  void failed(std::exception_ptr e) {
    future_->setError(std::move(e));
    finish();
  }

 private:
  void finish() {
    std::lock_guard<std::mutex> l(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  static std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& ts) {
    std::vector<c10::Device> out;
    for (const auto& t : ts)
      if (!t.device().is_cpu() && std::find(out.begin(), out.end(), t.device()) == out.end()) out.push_back(t.device());
    return out;
  }
  static const c10::TypePtr& list_type() {
    static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
    return t;
  }
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
};

// One thread that runs the engine's large reductions in the order they were asked for, so that the caller
// (DDP's backward pass) goes on while they run, as gloo's own threads let it. Every other engine call
// waits until it is idle first (idle()): the engine sees one caller at a time, in the same order on
// every rank.
class Runner {
 public:
  ~Runner() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void submit(std::function<void()> job) {
    std::lock_guard<std::mutex> l(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }
  void idle() {
    std::unique_lock<std::mutex> l(mu_);
    while (!(jobs_.empty() && !busy_)) done_cv_.wait_for(l, kTick);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      while (!(stop_ || !jobs_.empty())) cv_.wait_for(l, kTick);
      if (jobs_.empty()) return;  // stop_
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      l.unlock();
      job();  // never throws: its errors go to its Work
      l.lock();
      busy_ = false;
      if (jobs_.empty()) done_cv_.notify_all();
    }
  }
  // wait_for, not wait: libstdc++ 12 versions condition_variable::wait(unique_lock&) GLIBCXX_3.4.30, which
  // would lift the wheel's tag to manylinux_2_35; wait_for is inline over pthread_cond_clockwait.
  static constexpr std::chrono::seconds kTick{1};
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// Reductions at least this large run on the runner (LSPAWN_BACKEND_ASYNC_BYTES; unset or 0: never, every op
// in the caller's thread). Off by default: on 2 cores, DDP with 2 ranks ran 67-97 steps/s inline against
// 45-65 with the runner (bench/python_backend/ddp_bench.py), whose waiting competes with backward for the
// cores; it is for machines with cores to spare for communication.
std::size_t async_min_bytes() {
  static const std::size_t v = [] {
    const char* e = std::getenv("LSPAWN_BACKEND_ASYNC_BYTES");
    if (!e || !*e) return SIZE_MAX;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(e, &end, 10);
    if (*end) TORCH_CHECK(false, "lspawn: LSPAWN_BACKEND_ASYNC_BYTES='", e, "' is not a number of bytes");
    return n == 0 ? SIZE_MAX : static_cast<std::size_t>(n);
  }();
  return v;
}

// A Work whose op already ran: complete when returned.
WorkPtr done_work(c10d::OpType type, std::vector<at::Tensor> outputs) {
  auto w = c10::make_intrusive<FutureWork>(type, std::move(outputs));
  w->done();
  return w;
}

[[noreturn]] void fail(const std::string& what) {
#if LSPAWN_TORCH2
  C10_THROW_ERROR(DistBackendError, what);
#else
  TORCH_CHECK(false, what);
#endif
}

// The engine's element type for a dtype, or -1.
int engine_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return LSPAWN_ENGINE_FLOAT32;
    case at::kDouble: return LSPAWN_ENGINE_FLOAT64;
    case at::kHalf: return LSPAWN_ENGINE_FLOAT16;
    case at::kBFloat16: return LSPAWN_ENGINE_BFLOAT16;
    case at::kChar: return LSPAWN_ENGINE_INT8;
    case at::kByte: return LSPAWN_ENGINE_UINT8;
    case at::kInt: return LSPAWN_ENGINE_INT32;
    case at::kLong: return LSPAWN_ENGINE_INT64;
    case at::kBool: return LSPAWN_ENGINE_BOOL;
    default: return -1;
  }
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "?";
  }
}

// A tensor as the engine sees it: CPU, contiguous, dense. `buf` is the tensor itself when it
// already is, else a copy whose result goes back with finish().
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  bool copy_back = false;
  void finish() {
    if (copy_back) user.copy_(buf);
  }
};

Staged stage(const at::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) return {t, t, false};
  return {t, t.to(at::kCPU).contiguous(), true};
}

bool dense(const at::Tensor& t) { return t.layout() == c10::kStrided && !t.is_complex(); }
bool dense(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (!dense(t)) return false;
  return true;
}

std::size_t nbytes(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

class LspawnBackend final : public Base {
 public:
  // rank_hosts: each group rank's host, numbered in the order of the hosts' lowest ranks (ranks on one host
  // share its shared memory; empty: no engine, everything through gloo). leaders: the gloo backend of the
  // lowest rank of every host (its rank there: the host's number), on those ranks only, when the group spans
  // hosts (null on the others, and on one host).
  LspawnBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                std::vector<int> global_ranks, const std::string& group_id, c10::intrusive_ptr<Base> fallback,
                std::uintptr_t status_slot, std::vector<int> rank_hosts, c10::intrusive_ptr<Base> leaders)
      : Base(rank, size), store_(store), timeout_(timeout), global_ranks_(std::move(global_ranks)),
        group_id_(group_id), fallback_(std::move(fallback)), leaders_(std::move(leaders)),
        slot_(reinterpret_cast<void*>(status_slot)), hosts_(std::move(rank_hosts)),
        ipc_settings_(CudaIpcSettings::from_environment()) {
    if (global_ranks_.size() != static_cast<std::size_t>(size)) {
      global_ranks_.resize(size);
      for (int r = 0; r < size; ++r) global_ranks_[r] = r;
    }
    if (hosts_.empty()) return;
    if (hosts_.size() != static_cast<std::size_t>(size)) fail("lspawn backend: a host for each rank expected (a bug)");
    int nhosts = 0;
    for (int h : hosts_) nhosts = std::max(nhosts, h + 1);
    std::vector<int> count(nhosts, 0);
    place_.resize(size);
    for (int r = 0; r < size; ++r) {
      place_[r] = count[hosts_[r]]++;
      if (hosts_[r] == hosts_[rank]) local_ranks_.push_back(r);
    }
    widest_host_ = *std::max_element(count.begin(), count.end());
    spans_hosts_ = nhosts > 1;
    blocked_ = size % widest_host_ == 0;
    for (int r = 0; blocked_ && r < size; ++r) blocked_ = hosts_[r] == r / widest_host_;
    connect(hosts_[rank]);
  }
  ~LspawnBackend() override {
    runner_.reset();  // its last jobs run first
    ipc_.reset();     // its scratch and mappings
    if (engine_) lspawn_engine_destroy(engine_);
  }

  const std::string getBackendName() const override { return "lspawn"; }
  // "shm" when the engine carries this group's collectives (one host), "shm+gloo" when the reductions,
  // broadcast, the all_gathers and barrier run on shm within each host and gloo between the hosts'
  // leaders, "gloo" when every op goes to gloo.
  // The engine carries every rank of the group (one host): gather, scatter and all_to_all run on it too.
  bool whole() const { return engine_ && !spans_hosts_; }
  std::string transport() const { return engine_ ? (spans_hosts_ ? "shm+gloo" : "shm") : "gloo"; }
  // How many ops ran on lspawn's path (the engine; spanning hosts, with gloo between the leaders), how many
  // of those went device to device through CUDA IPC, and how many went to gloo whole, by op name
  // (lspawn.distributed.counts()).
  enum class Path { Lspawn, CudaIpc, Gloo };
  std::map<std::string, uint64_t> counts(Path path) const {
    std::map<std::string, uint64_t> out;
    const auto& ops = path == Path::Lspawn ? engine_ops_ : path == Path::CudaIpc ? ipc_ops_ : gloo_ops_;
    for (const auto& kv : ops) out[kv.first] += kv.second;
    return out;
  }
  // CUDA IPC in this group: "on" (it carried an op), "off: <why>", or "unused" (no CUDA tensor of
  // LSPAWN_SHM_CUDA_IPC_MIN_BYTES or more yet; LSPAWN_SHM_CUDA_IPC=0; the group spans hosts).
  std::string cuda_ipc_state() const {
    if (!ipc_) return "unused";
    return ipc_->off() ? "off: " + ipc_->why_off() : "on";
  }

  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    int etype = 0, eop = 0;
    bool avg = false;
    if (tensors.size() != 1 || !reducible(tensors[0], opts.reduceOp, "all_reduce", etype, eop, avg))
      return to_fallback("all_reduce", tensors, [&] { return fallback_->allreduce(tensors, opts); });
    // CUDA tensors in this thread: the copies to and from the device are on its stream.
    if (nbytes(tensors[0]) >= async_min_bytes() && !tensors[0].is_cuda()) {
      at::Tensor t = tensors[0];
      return run_async("all_reduce", nbytes(t), c10d::OpType::ALLREDUCE, tensors,
                       [this, t, etype, eop, avg]() mutable { reduce_in_place(t, etype, eop, avg); });
    }
    return run("all_reduce", nbytes(tensors[0]), c10d::OpType::ALLREDUCE, tensors, [&] {
      reduce_in_place(tensors[0], etype, eop, avg);
    });
  }

  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    int etype = 0, eop = 0;
    bool avg = false;
    std::size_t bytes = 0;
    for (auto& t : tensors) {
      if (!reducible(t, opts.reduceOp, "all_reduce_coalesced", etype, eop, avg))
        return to_fallback("all_reduce_coalesced", tensors, [&] { return fallback_->allreduce_coalesced(tensors, opts); });
      bytes += nbytes(t);
    }
    auto all = [this, ts = tensors, eop, avg]() mutable {
      for (auto& t : ts) reduce_in_place(t, engine_type(t.scalar_type()), eop, avg, "all_reduce_coalesced");
    };
    const bool cuda = std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_cuda(); });
    if (bytes >= async_min_bytes() && !cuda)
      return run_async("all_reduce_coalesced", bytes, c10d::OpType::ALLREDUCE_COALESCED, tensors, all);
    return run("all_reduce_coalesced", bytes, c10d::OpType::ALLREDUCE_COALESCED, tensors, all);
  }

  WorkPtr broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    if (!engine_ || tensors.size() != 1 || opts.rootTensor != 0 || !dense(tensors[0]))
      return to_fallback("broadcast", tensors, [&] { return fallback_->broadcast(tensors, opts); });
    check_root(opts.rootRank, "broadcast");
    return run("broadcast", nbytes(tensors[0]), c10d::OpType::BROADCAST, tensors, [&] {
      const int root = static_cast<int>(opts.rootRank);
      if (on_device(tensors[0], "broadcast", [&](CudaIpc& ipc) { return ipc.broadcast(tensors[0], root); })) return;
      Staged s = stage(tensors[0]);
      broadcast_bytes(s.buf.data_ptr(), nbytes(s.buf), static_cast<int>(opts.rootRank));
      s.finish();
    });
  }

  WorkPtr reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    int etype = 0, eop = 0;
    bool avg = false;
    if (tensors.size() != 1 || opts.rootTensor != 0 || !reducible(tensors[0], opts.reduceOp, "reduce", etype, eop, avg))
      return to_fallback("reduce", tensors, [&] { return fallback_->reduce(tensors, opts); });
    check_root(opts.rootRank, "reduce");
    return run("reduce", nbytes(tensors[0]), c10d::OpType::REDUCE, tensors, [&] {
      if (getRank() == opts.rootRank) {
        reduce_in_place(tensors[0], etype, eop, avg, "reduce");
      } else {  // the input of a rank that is not the root stays as it was (a scratch on its device: every
                // rank takes the path the root's tensor takes)
        at::Tensor scratch = tensors[0].clone(at::MemoryFormat::Contiguous);
        reduce_in_place(scratch, etype, eop, avg, "reduce");
      }
    });
  }

  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                    const c10d::AllgatherOptions& opts) override {
    if (!engine_ || inputs.size() != 1 || outputs.size() != 1 || !dense(inputs[0]) || !same_as(outputs[0], inputs[0]))
      return to_fallback("all_gather", inputs, [&] { return fallback_->allgather(outputs, inputs, opts); });
    return run("all_gather", nbytes(inputs[0]), c10d::OpType::ALLGATHER, outputs[0], [&] {
      at::Tensor on;  // every rank's input on the device
      if (on_device(inputs[0], "all_gather", [&](CudaIpc& ipc) {
            on = at::empty({inputs[0].numel() * getSize()}, inputs[0].options());
            return ipc.all_gather(inputs[0], on);
          }))
        return spread(on, outputs[0]);
      at::Tensor flat = gather_flat(inputs[0]);
      spread(flat, outputs[0]);
    });
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override {
    if (!dense(input) || !dense(output) || output.scalar_type() != input.scalar_type() ||
        output.numel() != input.numel() * getSize())
      return to_fallback("all_gather_into_tensor", {input}, [&] { return fallback_->_allgather_base(output, input, opts); });
    if (!engine_ && output.is_contiguous()) {
      // gloo's all_gather into views of the output (torch 1.13's gloo has no _allgather_base).
      return to_fallback("all_gather_into_tensor", {input}, [&] {
        std::vector<std::vector<at::Tensor>> outs(1);
        at::Tensor flat = output.view({-1});
        for (int r = 0; r < getSize(); ++r) outs[0].push_back(flat.narrow(0, r * input.numel(), input.numel()).view(input.sizes()));
        std::vector<at::Tensor> ins{input};
        return fallback_->allgather(outs, ins, opts);
      });
    }
    if (!engine_)
      return to_fallback("all_gather_into_tensor", {input}, [&] { return fallback_->_allgather_base(output, input, opts); });
    std::vector<at::Tensor> out{output};
    return run("all_gather_into_tensor", nbytes(input), c10d::OpType::_ALLGATHER_BASE, out, [&] {
      if (on_device(input, "all_gather_into_tensor", [&](CudaIpc& ipc) { return ipc.all_gather(input, output); }))
        return;
      Staged in = stage(input);
      Staged o = stage(output);
      gather_bytes(in.buf.data_ptr(), nbytes(in.buf), o.buf.data_ptr());
      o.finish();
    });
  }

  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                              const c10d::AllgatherOptions& opts) override {
    // outputs[r][i]: rank r's inputs[i].
    bool ok = engine_ && dense(inputs) && outputs.size() == static_cast<std::size_t>(getSize());
    for (std::size_t r = 0; ok && r < outputs.size(); ++r) {
      ok = outputs[r].size() == inputs.size();
      for (std::size_t i = 0; ok && i < inputs.size(); ++i)
        ok = outputs[r][i].numel() == inputs[i].numel() && outputs[r][i].scalar_type() == inputs[i].scalar_type();
    }
    if (!ok) return to_fallback("all_gather_coalesced", inputs, [&] { return fallback_->allgather_coalesced(outputs, inputs, opts); });
    std::size_t bytes = 0;
    for (auto& t : inputs) bytes += nbytes(t);
    std::vector<at::Tensor> all;
    for (auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
    return run("all_gather_coalesced", bytes, c10d::OpType::ALLGATHER_COALESCED, all, [&] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        at::Tensor flat = gather_flat(inputs[i]);
        for (int r = 0; r < getSize(); ++r) outputs[r][i].copy_(chunk(flat, r, inputs[i]));
      }
    });
  }

#if LSPAWN_TORCH2
  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    bool ok = engine_ && outputs.size() == inputs.size() && dense(inputs) && dense(outputs);
    for (std::size_t i = 0; ok && i < inputs.size(); ++i)
      ok = outputs[i].numel() == inputs[i].numel() * getSize() && outputs[i].scalar_type() == inputs[i].scalar_type();
    if (!ok)
      return to_fallback("all_gather_into_tensor_coalesced", inputs,
                         [&] { return fallback_->allgather_into_tensor_coalesced(outputs, inputs, opts); });
    std::size_t bytes = 0;
    for (auto& t : inputs) bytes += nbytes(t);
    return run("all_gather_into_tensor_coalesced", bytes, c10d::OpType::COALESCED, outputs, [&] {
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (on_device(inputs[i], "all_gather_into_tensor_coalesced",
                      [&](CudaIpc& ipc) { return ipc.all_gather(inputs[i], outputs[i]); }))
          continue;
        Staged in = stage(inputs[i]);
        Staged o = stage(outputs[i]);
        gather_bytes(in.buf.data_ptr(), nbytes(in.buf), o.buf.data_ptr());
        o.finish();
      }
    });
  }
#endif

  WorkPtr gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                 const c10d::GatherOptions& opts) override {
    const bool root = getRank() == opts.rootRank;
    bool ok = whole() && inputs.size() == 1 && dense(inputs[0]);
    if (ok && root) ok = outputs.size() == 1 && same_as(outputs[0], inputs[0]);
    if (!ok) return to_fallback("gather", inputs, [&] { return fallback_->gather(outputs, inputs, opts); });
    check_root(opts.rootRank, "gather");
    std::vector<at::Tensor> result = root ? outputs[0] : std::vector<at::Tensor>{};
    return run("gather", nbytes(inputs[0]), c10d::OpType::GATHER, result, [&] {
      at::Tensor flat = gather_flat(inputs[0]);
      if (root) spread(flat, outputs[0]);
    });
  }

  WorkPtr scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                  const c10d::ScatterOptions& opts) override {
    const bool root = getRank() == opts.rootRank;
    bool ok = whole() && outputs.size() == 1 && dense(outputs[0]);
    if (ok && root) ok = inputs.size() == 1 && same_as(inputs[0], outputs[0]);
    if (!ok) return to_fallback("scatter", outputs, [&] { return fallback_->scatter(outputs, inputs, opts); });
    check_root(opts.rootRank, "scatter");
    return run("scatter", nbytes(outputs[0]), c10d::OpType::SCATTER, outputs, [&] {
      // The root's pieces, end to end, broadcast; each rank keeps its own.
      at::Tensor flat = root ? at::cat(flatten_all(inputs[0]))
                             : at::empty({outputs[0].numel() * getSize()}, outputs[0].options().device(at::kCPU));
      check(lspawn_engine_broadcast(engine_, flat.data_ptr(), nbytes(flat), static_cast<int>(opts.rootRank), &err_));
      outputs[0].copy_(chunk(flat, getRank(), outputs[0]));
    });
  }

  WorkPtr reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    int etype = 0, eop = 0;
    bool avg = false;
    bool ok = outputs.size() == 1 && inputs.size() == 1 && same_as(inputs[0], outputs[0]) &&
              reducible(outputs[0], opts.reduceOp, "reduce_scatter", etype, eop, avg);
    if (!ok) return to_fallback("reduce_scatter", outputs, [&] { return fallback_->reduce_scatter(outputs, inputs, opts); });
    return run("reduce_scatter", nbytes(outputs[0]) * getSize(), c10d::OpType::REDUCE_SCATTER, outputs, [&] {
      at::Tensor flat = at::cat(flatten_all(inputs[0]));
      reduce_in_place(flat, etype, eop, avg);
      outputs[0].copy_(chunk(flat, getRank(), outputs[0]));
    });
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    int etype = 0, eop = 0;
    bool avg = false;
    bool ok = input.scalar_type() == output.scalar_type() && input.numel() == output.numel() * getSize() &&
              reducible(input, opts.reduceOp, "reduce_scatter_tensor", etype, eop, avg);
    if (!ok)
      return to_fallback("reduce_scatter_tensor", {input}, [&] { return fallback_->_reduce_scatter_base(output, input, opts); });
    std::vector<at::Tensor> out{output};
    return run("reduce_scatter_tensor", nbytes(input), c10d::OpType::_REDUCE_SCATTER_BASE, out, [&] {
      // On the device: the whole reduction, this rank's part kept.
      at::Tensor whole_sum;
      if (on_device(input, "reduce_scatter_tensor", [&](CudaIpc& ipc) {
            whole_sum = input.flatten().clone();
            return ipc.all_reduce(whole_sum, eop);
          })) {
        if (avg) whole_sum.div_(getSize());
        output.copy_(chunk(whole_sum, getRank(), output));
        return;
      }
      at::Tensor flat = input.to(at::kCPU).flatten().clone();
      reduce_in_place(flat, etype, eop, avg);
      output.copy_(chunk(flat, getRank(), output));
    });
  }

#if LSPAWN_TORCH2
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    if (outputs.size() != inputs.size()) fail("lspawn backend: reduce_scatter_tensor_coalesced: as many outputs as inputs");
    std::vector<WorkPtr> works;
    for (std::size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
    for (auto& w : works) w->wait();
    return done_work(c10d::OpType::COALESCED, outputs);
  }
#endif

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                        std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override {
    if (!whole() || !dense(input) || !dense(output) || input.scalar_type() != output.scalar_type())
      return to_fallback("all_to_all_single", {input}, [&] {
        return fallback_->alltoall_base(output, input, output_splits, input_splits, opts);
      });
    const int n = getSize();
    auto rows = [n](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      const int64_t dim0 = t.dim() == 0 ? 1 : t.size(0);
      std::vector<int64_t> s = splits;
      if (s.empty()) {
        if (dim0 % n != 0)
          fail(std::string("lspawn backend: all_to_all_single: the ") + which + " tensor's first dimension (" +
               std::to_string(dim0) + ") does not split evenly among " + std::to_string(n) + " ranks");
        s.assign(n, dim0 / n);
      }
      if (static_cast<int>(s.size()) != n)
        fail(std::string("lspawn backend: all_to_all_single: ") + std::to_string(s.size()) + " " + which +
             " split sizes for " + std::to_string(n) + " ranks");
      return s;
    };
    const std::vector<int64_t> in_rows = rows(input, input_splits, "input");
    const std::vector<int64_t> out_rows = rows(output, output_splits, "output");
    const int64_t in_row_bytes = input.dim() == 0 ? nbytes(input) : nbytes(input) / std::max<int64_t>(1, input.size(0));
    const int64_t out_row_bytes =
        output.dim() == 0 ? nbytes(output) : nbytes(output) / std::max<int64_t>(1, output.size(0));
    std::vector<int64_t> in_bytes(n), out_bytes(n);
    for (int r = 0; r < n; ++r) {
      in_bytes[r] = in_rows[r] * in_row_bytes;
      out_bytes[r] = out_rows[r] * out_row_bytes;
    }
    std::vector<at::Tensor> out{output};
    return run("all_to_all_single", nbytes(input), c10d::OpType::ALLTOALL_BASE, out, [&] {
      Staged in = stage(input);
      Staged o = stage(output);
      exchange(static_cast<const unsigned char*>(in.buf.data_ptr()), in_bytes,
               static_cast<unsigned char*>(o.buf.data_ptr()), out_bytes, "all_to_all_single");
      o.finish();
    });
  }

  WorkPtr alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                   const c10d::AllToAllOptions& opts) override {
    const int n = getSize();
    if (static_cast<int>(inputs.size()) != n || static_cast<int>(outputs.size()) != n || !dense(inputs) || !dense(outputs))
      return to_fallback("all_to_all", inputs, [&] { return fallback_->alltoall(outputs, inputs, opts); });
    if (!whole()) {
      // gloo's all_to_all_single over the bytes, packed and unpacked here (torch 1.13's gloo has no all_to_all).
      return to_fallback("all_to_all", inputs, [&] {
        std::vector<int64_t> in_splits(n), out_splits(n);
        int64_t in_total = 0, out_total = 0;
        for (int r = 0; r < n; ++r) {
          in_total += in_splits[r] = static_cast<int64_t>(nbytes(inputs[r]));
          out_total += out_splits[r] = static_cast<int64_t>(nbytes(outputs[r]));
        }
        const auto bytes = at::TensorOptions().dtype(at::kByte);
        at::Tensor packed = at::empty({in_total}, bytes);
        at::Tensor unpacked = at::empty({out_total}, bytes);
        int64_t off = 0;
        for (int r = 0; r < n; ++r) {
          at::Tensor c = inputs[r].to(at::kCPU).contiguous();
          if (in_splits[r]) std::memcpy(packed.data_ptr<uint8_t>() + off, c.data_ptr(), in_splits[r]);
          off += in_splits[r];
        }
        std::vector<int64_t> out_counts = out_splits, in_counts = in_splits;  // gloo may move from them
        fallback_->alltoall_base(unpacked, packed, out_counts, in_counts, opts)->wait();
        off = 0;
        for (int r = 0; r < n; ++r) {
          at::Tensor c = at::empty(outputs[r].sizes(), outputs[r].options().device(at::kCPU));
          if (out_splits[r]) std::memcpy(c.data_ptr(), unpacked.data_ptr<uint8_t>() + off, out_splits[r]);
          outputs[r].copy_(c);
          off += out_splits[r];
        }
        return done_work(c10d::OpType::ALLTOALL, outputs);
      });
    }
    std::vector<int64_t> in_bytes(n), out_bytes(n);
    std::size_t total = 0;
    for (int r = 0; r < n; ++r) {
      in_bytes[r] = nbytes(inputs[r]);
      out_bytes[r] = nbytes(outputs[r]);
      total += in_bytes[r];
    }
    return run("all_to_all", total, c10d::OpType::ALLTOALL, outputs, [&] {
      at::Tensor packed = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
      std::size_t off = 0;
      for (int r = 0; r < n; ++r) {
        at::Tensor c = inputs[r].to(at::kCPU).contiguous();
        std::memcpy(packed.data_ptr<uint8_t>() + off, c.data_ptr(), nbytes(c));
        off += nbytes(c);
      }
      std::size_t out_total = 0;
      for (int r = 0; r < n; ++r) out_total += out_bytes[r];
      at::Tensor unpacked = at::empty({static_cast<int64_t>(out_total)}, at::TensorOptions().dtype(at::kByte));
      exchange(packed.data_ptr<uint8_t>(), in_bytes, unpacked.data_ptr<uint8_t>(), out_bytes, "all_to_all");
      off = 0;
      for (int r = 0; r < n; ++r) {
        at::Tensor src = unpacked.narrow(0, off, out_bytes[r]);
        outputs[r].copy_(at::from_blob(src.data_ptr(), outputs[r].sizes(),
                                       at::TensorOptions().dtype(outputs[r].scalar_type())));
        off += out_bytes[r];
      }
    });
  }

  WorkPtr barrier(const c10d::BarrierOptions& opts) override {
    if (!engine_) return to_fallback("barrier", {}, [&] { return fallback_->barrier(opts); });
    return run("barrier", 0, c10d::OpType::BARRIER, {}, [&] {
      check(lspawn_engine_barrier(engine_, &err_));
      if (!spans_hosts_) return;
      // Every host's ranks are in (above); the leaders meet; each host waits for its leader.
      if (leaders_) {
        c10d::BarrierOptions o;
        o.timeout = timeout_;
        between_hosts("barrier", [&] { leaders_->barrier(o)->wait(); });
      }
      check(lspawn_engine_barrier(engine_, &err_));
    });
  }

  // ProcessGroup.abort() (torch 2.x: distributed_c10d._abort_process_group(), the way torchft and others leave a
  // group that a peer holds up): this rank leaves the group as after a failure, and every later op fails. It may
  // come from another thread while an op runs: an op in the engine then fails within ~20 ms ("aborted while
  // waiting"), one in the step between hosts waits for that step (gloo's, which cannot be aborted), and a gloo
  // op (point to point, the fallback) is left as it is. Declared without `override`: it overrides
  // Backend::abort() where torch has one (from 2.7; torch calls it then, the module's ABORT says so), and is a
  // member of its own, never called, on the releases without.
  void abort() {
    aborted_.store(true);
    if (engine_) lspawn_engine_abort(engine_, "it aborted the group (ProcessGroup.abort())");
  }

  // Point to point: gloo's, recorded.
  WorkPtr send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return to_fallback("send", tensors, [&] { return fallback_->send(tensors, dst, tag); });
  }
  WorkPtr recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return to_fallback("recv", tensors, [&] { return fallback_->recv(tensors, src, tag); });
  }
  WorkPtr recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return to_fallback("recv", tensors, [&] { return fallback_->recvAnysource(tensors, tag); });
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    fallback_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { fallback_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return fallback_->getSequenceNumberForGroup(); }

 private:
  void connect(int host_index) {
    struct Ctx {
      c10d::Store* store;
      std::string prefix;
    } ctx{store_.get(), "lspawn/shm/" + std::to_string(host_index) + "/"};
    auto set = [](void* c, const char* key, const void* value, size_t len, lspawn_engine_error* err) -> int {
      auto* x = static_cast<Ctx*>(c);
      try {
        const auto* p = static_cast<const uint8_t*>(value);
        x->store->set(x->prefix + key, std::vector<uint8_t>(p, p + len));
        return 0;
      } catch (const std::exception& e) {
        std::snprintf(err->message, sizeof err->message, "store set %s: %s", key, e.what());
        return -1;
      }
    };
    auto get = [](void* c, const char* key, void* buf, size_t cap, lspawn_engine_error* err) -> long {
      auto* x = static_cast<Ctx*>(c);
      try {
        std::vector<uint8_t> v = x->store->get(x->prefix + key);
        std::memcpy(buf, v.data(), std::min(cap, v.size()));
        return static_cast<long>(v.size());
      } catch (const std::exception& e) {
        std::snprintf(err->message, sizeof err->message, "store get %s: %s", key, e.what());
        return -1;
      }
    };
    std::string label = "lspawn-pg" + group_id_;
    for (char& c : label)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
    const auto me = std::find(local_ranks_.begin(), local_ranks_.end(), getRank());
    if (me == local_ranks_.end()) fail("lspawn backend: this rank is not among its host's ranks (a bug)");
    std::vector<int> shown;
    for (int r : local_ranks_) shown.push_back(global_ranks_[r]);
    engine_ = lspawn_engine_create(static_cast<int>(me - local_ranks_.begin()), static_cast<int>(local_ranks_.size()),
                                   label.c_str(), timeout_.count(), shown.data(), set, get, &ctx, &err_);
    if (!engine_) fail(std::string("lspawn backend: could not set up shared memory for group '") + group_id_ +
                       "' (rank " + std::to_string(global_ranks_[getRank()]) + "): " + err_.message);
  }

  // Whether the engine can reduce `t` with `op`; refuses (throws) what no backend here would do right.
  bool reducible(const at::Tensor& t, const c10d::ReduceOp& op, const char* what, int& etype, int& eop, bool& avg) {
    avg = false;
    switch (op.op_) {
      case c10d::ReduceOp::SUM: eop = LSPAWN_ENGINE_SUM; break;
      case c10d::ReduceOp::PRODUCT: eop = LSPAWN_ENGINE_PRODUCT; break;
      case c10d::ReduceOp::MIN: eop = LSPAWN_ENGINE_MIN; break;
      case c10d::ReduceOp::MAX: eop = LSPAWN_ENGINE_MAX; break;
      case c10d::ReduceOp::BAND: eop = LSPAWN_ENGINE_BAND; break;
      case c10d::ReduceOp::BOR: eop = LSPAWN_ENGINE_BOR; break;
      case c10d::ReduceOp::BXOR: eop = LSPAWN_ENGINE_BXOR; break;
      case c10d::ReduceOp::AVG:
        eop = LSPAWN_ENGINE_SUM;
        avg = true;
        if (!at::isFloatingType(t.scalar_type()))
          fail(std::string("lspawn backend: ") + what + " with ReduceOp.AVG on " + std::string(c10::toString(t.scalar_type())) +
               " tensors is not supported (an integer mean is not exact): use ReduceOp.SUM and divide, or a "
               "floating-point tensor");
        break;
      default:
        fail(std::string("lspawn backend: ") + what + " with ReduceOp." + op_name(op.op_) +
             " is not supported by lspawn or gloo: use the nccl backend for CUDA tensors, or ReduceOp.SUM after "
             "scaling the input");
    }
    if (!engine_ || !dense(t)) return false;
    etype = engine_type(t.scalar_type());
    if (etype < 0 || !lspawn_engine_supports(etype, eop)) {
      if (avg) fail(std::string("lspawn backend: ") + what + " with ReduceOp.AVG on " +
                    std::string(c10::toString(t.scalar_type())) + " tensors is not supported: use ReduceOp.SUM and divide");
      return false;  // gloo's (or gloo's refusal)
    }
    return true;
  }

  // All ranks' `t` reduced into every rank's `t`: on shm, or (spanning hosts) on shm within the host, then
  // gloo among the hosts' leaders, then a shm broadcast from the leader (local rank 0).
  // `what`: the op, as counts() names it when CUDA IPC carries it.
  void reduce_in_place(at::Tensor& t, int etype, int eop, bool avg, const char* what = "all_reduce") {
    if (on_device(t, what, [&](CudaIpc& ipc) { return ipc.all_reduce(t, eop); })) {
      if (avg) t.div_(getSize());
      return;
    }
    Staged s = stage(t);
    check(lspawn_engine_all_reduce(engine_, s.buf.data_ptr(), static_cast<size_t>(s.buf.numel()), etype, eop, &err_));
    if (spans_hosts_) {
      if (leaders_) {
        // gloo (1.13) has no bfloat16 or bool: bfloat16 goes as float32 (each host's partial result is exact
        // in it; rounded once on the way back), bool as 0/1 bytes (sum/max: or, product/min: and).
        at::Tensor x = s.buf;
        int op = eop;
        if (x.scalar_type() == at::kBFloat16) {
          x = x.to(at::kFloat);
        } else if (x.scalar_type() == at::kBool) {
          x = x.to(at::kByte);
          if (op == LSPAWN_ENGINE_SUM) op = LSPAWN_ENGINE_MAX;
          if (op == LSPAWN_ENGINE_PRODUCT) op = LSPAWN_ENGINE_MIN;
        }
        std::vector<at::Tensor> one{x};
        c10d::AllreduceOptions o;
        o.reduceOp = leader_op(op);
        o.timeout = timeout_;
        between_hosts("all_reduce", [&] { leaders_->allreduce(one, o)->wait(); });
        if (!x.is_same(s.buf)) s.buf.copy_(x);
      }
      check(lspawn_engine_broadcast(engine_, s.buf.data_ptr(), nbytes(s.buf), 0, &err_));
    }
    if (avg) s.buf.div_(getSize());
    s.finish();
  }
  static c10d::ReduceOp leader_op(int eop) {
    switch (eop) {
      case LSPAWN_ENGINE_PRODUCT: return c10d::ReduceOp::PRODUCT;
      case LSPAWN_ENGINE_MIN: return c10d::ReduceOp::MIN;
      case LSPAWN_ENGINE_MAX: return c10d::ReduceOp::MAX;
      case LSPAWN_ENGINE_BAND: return c10d::ReduceOp::BAND;
      case LSPAWN_ENGINE_BOR: return c10d::ReduceOp::BOR;
      case LSPAWN_ENGINE_BXOR: return c10d::ReduceOp::BXOR;
      default: return c10d::ReduceOp::SUM;
    }
  }

  // Every rank's `input`, end to end (size * numel), CPU.
  at::Tensor gather_flat(const at::Tensor& input) {
    Staged in = stage(input);
    at::Tensor flat = at::empty({in.buf.numel() * getSize()}, in.buf.options());
    gather_bytes(in.buf.data_ptr(), nbytes(in.buf), flat.data_ptr());
    return flat;
  }

  // The root's n bytes at p into every rank's p: on shm, or (spanning hosts) on shm within the root's host,
  // gloo among the hosts' leaders from the root's host's, then on shm within every other host from its leader.
  void broadcast_bytes(void* p, std::size_t n, int root) {
    if (!spans_hosts_) {
      check(lspawn_engine_broadcast(engine_, p, n, root, &err_));
      return;
    }
    const int root_host = hosts_[root];
    const bool here = hosts_[getRank()] == root_host;
    if (here) check(lspawn_engine_broadcast(engine_, p, n, place_[root], &err_));
    if (leaders_ && n) {
      std::vector<at::Tensor> bytes{at::from_blob(p, {static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kByte))};
      c10d::BroadcastOptions o;
      o.rootRank = root_host;
      o.timeout = timeout_;
      between_hosts("broadcast", [&] { leaders_->broadcast(bytes, o)->wait(); });
    }
    if (!here) check(lspawn_engine_broadcast(engine_, p, n, 0, &err_));
  }

  // Every rank's n bytes at `in`, end to end in rank order, into every rank's `out` (size * n): on shm, or
  // (spanning hosts, any layout) on shm within each host into a block (its ranks in order, padded to the widest host),
  // gloo's all_gather of the blocks among the leaders, each leader puts them in rank order, and a shm
  // broadcast from it within its host.
  void gather_bytes(const void* in, std::size_t n, void* out) {
    if (!spans_hosts_) {
      check(lspawn_engine_all_gather(engine_, in, n, out, &err_));
      return;
    }
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    if (blocked_) {
      // Hosts of one size whose ranks are consecutive (the usual layout): each host's block is its slice of
      // `out`. The engine gathers into it, gloo's all_gather copies the blocks into place, and each host's
      // broadcast carries the other hosts' blocks only: no block of our own, no reordering.
      auto* o = static_cast<unsigned char*>(out);
      const std::size_t block = n * widest_host_;
      const int me = hosts_[getRank()], nhosts = getSize() / widest_host_;
      check(lspawn_engine_all_gather(engine_, in, n, o + me * block, &err_));
      if (leaders_ && n) {
        auto slice = [&](int h) { return at::from_blob(o + h * block, {static_cast<int64_t>(block)}, bytes); };
        std::vector<std::vector<at::Tensor>> blocks(1);
        for (int h = 0; h < nhosts; ++h) blocks[0].push_back(slice(h));
        std::vector<at::Tensor> mine{slice(me)};  // gloo copies its input into a buffer of its own first
        c10d::AllgatherOptions opt;
        opt.timeout = timeout_;
        between_hosts("all_gather", [&] { leaders_->allgather(blocks, mine, opt)->wait(); });
      }
      if (me > 0) check(lspawn_engine_broadcast(engine_, o, me * block, 0, &err_));
      if (me + 1 < nhosts) check(lspawn_engine_broadcast(engine_, o + (me + 1) * block, (nhosts - me - 1) * block, 0, &err_));
      return;
    }
    at::Tensor block = at::empty({static_cast<int64_t>(n) * widest_host_}, bytes);
    check(lspawn_engine_all_gather(engine_, in, n, block.data_ptr(), &err_));
    if (leaders_ && n) {
      std::vector<std::vector<at::Tensor>> blocks(1);
      for (int h = 0; h < leaders_->getSize(); ++h) blocks[0].push_back(at::empty({block.numel()}, bytes));
      std::vector<at::Tensor> mine{block};
      c10d::AllgatherOptions o;
      o.timeout = timeout_;
      between_hosts("all_gather", [&] { leaders_->allgather(blocks, mine, o)->wait(); });
      auto* dst = static_cast<unsigned char*>(out);
      for (int r = 0; r < getSize(); ++r)
        std::memcpy(dst + r * n, blocks[0][hosts_[r]].data_ptr<uint8_t>() + place_[r] * n, n);
    }
    check(lspawn_engine_broadcast(engine_, out, n * getSize(), 0, &err_));
  }
  at::Tensor chunk(const at::Tensor& flat, int r, const at::Tensor& like) {
    return flat.narrow(0, static_cast<int64_t>(r) * like.numel(), like.numel()).view(like.sizes());
  }
  void spread(const at::Tensor& flat, std::vector<at::Tensor>& outputs) {
    for (int r = 0; r < getSize(); ++r) outputs[r].copy_(chunk(flat, r, outputs[r]));
  }
  static std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts) out.push_back(t.to(at::kCPU).flatten());
    return out;
  }
  bool same_as(const std::vector<at::Tensor>& list, const at::Tensor& like) const {
    if (static_cast<int>(list.size()) != getSize()) return false;
    for (const auto& t : list)
      if (!dense(t) || t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) return false;
    return true;
  }

  // Personalised exchange: in_bytes[r] bytes of `in` (end to end, by destination) go to rank r;
  // out_bytes[r] bytes from rank r land in `out` (end to end, by source). One all_gather of the
  // size tables, one of every rank's input padded to the largest.
  void exchange(const unsigned char* in, const std::vector<int64_t>& in_bytes, unsigned char* out,
                const std::vector<int64_t>& out_bytes, const char* what) {
    const int n = getSize();
    std::vector<int64_t> table(static_cast<std::size_t>(n) * n);
    check(lspawn_engine_all_gather(engine_, in_bytes.data(), n * sizeof(int64_t), table.data(), &err_));
    int64_t widest = 0;
    for (int r = 0; r < n; ++r) {
      int64_t sum = 0;
      for (int d = 0; d < n; ++d) sum += table[r * n + d];
      widest = std::max(widest, sum);
    }
    for (int r = 0; r < n; ++r)
      if (table[r * n + getRank()] != out_bytes[r])
        fail(std::string("lspawn backend: ") + what + ": rank " + std::to_string(global_ranks_[r]) + " sends " +
             std::to_string(table[r * n + getRank()]) + " bytes to rank " + std::to_string(global_ranks_[getRank()]) +
             ", which expects " + std::to_string(out_bytes[r]));
    std::vector<unsigned char> mine(static_cast<std::size_t>(widest)), all(static_cast<std::size_t>(widest) * n);
    int64_t sent = 0;
    for (int d = 0; d < n; ++d) sent += in_bytes[d];
    if (sent) std::memcpy(mine.data(), in, sent);
    check(lspawn_engine_all_gather(engine_, mine.data(), widest, all.data(), &err_));
    int64_t off_out = 0;
    for (int r = 0; r < n; ++r) {
      int64_t off_in = 0;
      for (int d = 0; d < getRank(); ++d) off_in += table[r * n + d];
      if (out_bytes[r]) std::memcpy(out + off_out, all.data() + r * widest + off_in, out_bytes[r]);
      off_out += out_bytes[r];
    }
  }

  // The leaders' gloo step of a collective spanning hosts; its failure says which step and which ranks lead
  // the hosts. gloo names only an address ("Connection closed by peer [10.0.0.2]:41234"): most often another
  // host's leader gave up because a rank of its host died, and that host's ranks name the dead one.
  template <typename F>
  void between_hosts(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      std::string leaders;
      for (int r = 0, h = 0; r < getSize(); ++r)
        if (hosts_[r] == h) {
          leaders += (h ? ", " : "") + std::to_string(global_ranks_[r]) + " (host " + std::to_string(h) + ")";
          ++h;
        }
      std::string first = e.what();
      first = first.substr(0, first.find('\n'));
      // The rank that saw the first death on its host names it (up to 3 s to write it); after abort() there
      // is nothing to wait for: this rank knows why its step failed.
      int rank = -1;
      const auto wait = aborted_.load() ? std::chrono::milliseconds(0)
                                        : std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(3));
      const std::string note = read_note(wait, rank);
      leave(prefix() + what + " between hosts failed in the hosts' leaders' gloo step (leaders: ranks " + leaders +
                "): " + first +
                (note.empty() ? ". Likely a rank of another host failed or was stopped, and its leader left: that "
                                "host's ranks name it"
                              : "; first failure in the group: " + note),
            std::string(what) + " between hosts failed (the hosts' leaders' gloo step)");
    }
  }

  std::string prefix() const {
    return "lspawn backend (group '" + group_id_ + "', rank " + std::to_string(global_ranks_[getRank()]) + "): ";
  }

  // After an op on lspawn's path failed here, this rank leaves the group, so that nobody waits for it: it may
  // live on (a trainer that catches the error to make a new group). Its engine says so in the host's segment
  // (the host's ranks that wait for it fail at once, LSPAWN_ENGINE_PEER_LEFT, quoting `reason`), and a leader
  // closes its gloo connections to the other hosts' leaders (they fail at once in their step between hosts,
  // instead of waiting out the group's timeout). Every later op on that path fails with this first failure
  // (check_usable), instead of meeting the host's ranks mid-op (a "mismatch" that hides the cause).
  [[noreturn]] void leave(const std::string& message, const std::string& reason) {
    if (failure_.empty()) {
      const std::string mine = prefix();
      failure_ = message.substr(message.compare(0, mine.size(), mine) == 0 ? mine.size() : 0);
      failure_ = failure_.substr(0, failure_.find('\n'));
    }
    if (engine_) lspawn_engine_abort(engine_, reason.c_str());
    leaders_.reset();  // the only reference: ProcessGroupGloo's destructor closes its pairs
    fail(message);
  }
  void check_usable() const {
    if (!failure_.empty()) fail(prefix() + "unusable after an earlier failure (make a new group): " + failure_);
    if (aborted_.load()) fail(prefix() + "the group was aborted (ProcessGroup.abort()): make a new group");
  }

  void check_root(int64_t root, const char* what) {
    if (root < 0 || root >= getSize())
      fail(std::string("lspawn backend: ") + what + ": root " + std::to_string(root) + " is not a rank of this group of " +
           std::to_string(getSize()));
  }

  void check(int rc) {
    if (rc == LSPAWN_ENGINE_OK) return;
    std::string msg = prefix() + err_.message;
    if (spans_hosts_) msg += first_failure(err_.kind, err_.rank, err_.message);
    leave(msg, err_.message);
  }

  // Runs f(ipc) when `t` takes CUDA IPC (_cuda_ipc.h): a CUDA tensor of LSPAWN_SHM_CUDA_IPC_MIN_BYTES or more in
  // a group on one host. true when it carried the op (counted under `what`); false: stage it (IPC is off, or
  // was turned off by this op on every rank alike). The same choice on every rank of a group whose ranks pass
  // alike tensors; a rank that does not meets the others' exchange of records, and the engine fails the op on
  // every rank, naming the ranks.
  template <typename F>
  bool on_device(const at::Tensor& t, const char* what, F&& f) {
    if (!whole() || !ipc_settings_.wanted || !t.is_cuda() || nbytes(t) < ipc_settings_.min_bytes) return false;
    if (!ipc_) {
      auto all_gather = [this](const void* in, std::size_t n, void* out) {
        check(lspawn_engine_all_gather(engine_, in, n, out, &err_));
      };
      ipc_ = std::make_unique<CudaIpc>(getRank(), getSize(), global_ranks_, all_gather,
                                       [this] { check(lspawn_engine_barrier(engine_, &err_)); });
    }
    if (ipc_->off() || !f(*ipc_)) return false;
    ++ipc_ops_[what];
    return true;
  }

  // Across hosts, the rank that died first, as the C++ runtime's hierarchy says it (collectives/hierarchy.hpp):
  // a rank whose engine saw a rank of its host die writes a note into the group's store, first writer wins;
  // every rank whose op then fails (a leader whose gloo peer left, a rank whose leader left) reads it and names
  // that rank, not its own neighbour. Returns "; first failure in the group: <note>" or "".
  std::string first_failure(int kind, int dead, const std::string& text) {
    if (kind == LSPAWN_ENGINE_PEER_DIED && dead >= 0) {
      const std::string v = std::to_string(dead) + "\n" + "rank " + std::to_string(dead) + " died (host " +
                            std::to_string(hosts_[getRank()]) + "), seen by rank " +
                            std::to_string(global_ranks_[getRank()]) + ": " + text.substr(0, text.find('\n'));
      try {
        store_->compareSet(kNoteKey, {}, std::vector<uint8_t>(v.begin(), v.end()));
      } catch (...) {
        // the store is gone (its host died): the others keep their own view
      }
    }
    if (kind != LSPAWN_ENGINE_PEER_DIED && kind != LSPAWN_ENGINE_TIMEOUT && kind != LSPAWN_ENGINE_PEER_LEFT) return "";
    int rank = -1;
    std::string note = read_note(std::chrono::milliseconds(0), rank);
    return !note.empty() && rank != dead ? "; first failure in the group: " + note : "";
  }
  // The note's text (its rank in `rank`), waiting up to `wait` for it; "" when there is none (or no store).
  std::string read_note(std::chrono::milliseconds wait, int& rank) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    try {
      for (;;) {
        if (store_->check({kNoteKey})) {
          const auto v = store_->get(kNoteKey);
          const std::string s(v.begin(), v.end());
          const auto nl = s.find('\n');
          if (nl == std::string::npos) return "";
          rank = std::atoi(s.substr(0, nl).c_str());
          return s.substr(nl + 1);
        }
        if (std::chrono::steady_clock::now() >= deadline) return "";
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (...) {
      return "";
    }
  }
  static constexpr const char* kNoteKey = "lspawn/failure";

  // Runs an op on the engine, bracketed in the status record; the Work is complete.
  template <typename F>
  WorkPtr run(const char* what, std::size_t bytes, c10d::OpType type, const std::vector<at::Tensor>& outputs, F&& f) {
    if (runner_) runner_->idle();  // the engine's calls stay in the order they were asked for
    ++engine_ops_[what];
    const uint64_t seq = ++seq_;
    lspawn_status_enter(slot_, what, seq, bytes);
    try {
      check_usable();
      f();
    } catch (...) {
      lspawn_status_complete(slot_, seq);
      throw;
    }
    lspawn_status_complete(slot_, seq);
    return done_work(type, outputs);
  }

  // Queues an op for the runner thread; the Work completes when it has run (or failed).
  template <typename F>
  WorkPtr run_async(const char* what, std::size_t bytes, c10d::OpType type, const std::vector<at::Tensor>& outputs, F f) {
    if (!runner_) runner_ = std::make_unique<Runner>();
    ++engine_ops_[what];
    const uint64_t seq = ++seq_;
    lspawn_status_enter(slot_, what, seq, bytes);
    auto work = c10::make_intrusive<FutureWork>(type, outputs);
    void* slot = slot_;
    runner_->submit([this, f = std::move(f), work, slot, seq]() mutable {
      try {
        check_usable();
        f();
        lspawn_status_complete(slot, seq);
        work->done();
      } catch (...) {
        lspawn_status_complete(slot, seq);
        work->failed(std::current_exception());
      }
    });
    return work;
  }

  // Hands an op to gloo, recorded until its future completes.
  template <typename F>
  WorkPtr to_fallback(const char* what, const std::vector<at::Tensor>& tensors, F&& f) {
    std::size_t bytes = 0;
    for (const auto& t : tensors) bytes += nbytes(t);
    ++gloo_ops_[what];
    const uint64_t seq = ++seq_;
    lspawn_status_enter(slot_, what, seq, bytes);
    WorkPtr w;
    try {
      w = f();
    } catch (...) {
      lspawn_status_complete(slot_, seq);
      throw;
    }
    if (slot_) {
      void* slot = slot_;
      w->getFuture()->addCallback([slot, seq](c10::ivalue::Future&) { lspawn_status_complete(slot, seq); });
    }
    return w;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::vector<int> global_ranks_;
  std::string group_id_;
  c10::intrusive_ptr<Base> fallback_;
  c10::intrusive_ptr<Base> leaders_;  // the hosts' leaders, when the group spans hosts and this rank leads
  std::string failure_;               // the first failure on lspawn's path (leave()); later ops fail with it
  std::atomic<bool> aborted_{false};  // abort() was called (from any thread)
  void* slot_ = nullptr;
  std::vector<int> hosts_;            // each group rank's host (empty: no engine)
  std::vector<int> place_;            // each group rank's place among its host's ranks (its engine rank)
  std::vector<int> local_ranks_;      // the group ranks on this host
  int widest_host_ = 0;               // the most ranks on one host
  bool blocked_ = false;              // hosts of one size, each a run of consecutive ranks
  bool spans_hosts_ = false;
  lspawn_engine* engine_ = nullptr;
  lspawn_engine_error err_{};  // written by whichever thread calls the engine (one at a time: run())
  std::unique_ptr<Runner> runner_;  // made at the first large reduction
  const CudaIpcSettings ipc_settings_;  // read at construction: a bad value fails init_process_group
  std::unique_ptr<CudaIpc> ipc_;        // made at the first CUDA tensor that takes it (on_device)
  uint64_t seq_ = 0;
  // counts(): by the op's name, a literal (one pointer per call site; counts() adds up equal names).
  std::unordered_map<const char*, uint64_t> engine_ops_, gloo_ops_, ipc_ops_;
};

}  // namespace lspawn_backend

// Whether torch's backend class has the virtual abort() that LspawnBackend::abort() then overrides (and
// ProcessGroup.abort() calls): from torch 2.7 (2.6 has _abort_process_group() but no Backend::abort()).
template <typename T, typename = void>
struct HasAbort : std::false_type {};
template <typename T>
struct HasAbort<T, std::void_t<decltype(&T::abort)>> : std::true_type {};

PYBIND11_MODULE(_lspawn_backend, m) {
  namespace py = pybind11;
  m.attr("ENGINE_ABI") = LSPAWN_ENGINE_ABI;
  m.attr("ABORT") = HasAbort<lspawn_backend::Base>::value;
  // The backend's settings (LSPAWN_SHM_CUDA_IPC, LSPAWN_SHM_CUDA_IPC_MIN_BYTES): a bad one raises ValueError
  // naming it. Called before any rendezvous, so that every rank fails on its own reading, not on a peer that
  // left (create() reads them again).
  m.def("check_settings", [] { (void)lspawn_backend::CudaIpcSettings::from_environment(); });
  m.def("engine_abi", [] { return lspawn_engine_abi(); });
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms,
         std::vector<int> global_ranks, const std::string& group_id,
         const c10::intrusive_ptr<lspawn_backend::Base>& fallback, std::uintptr_t status_slot,
         std::vector<int> rank_hosts, const py::object& leaders_or_none) {
        c10::intrusive_ptr<lspawn_backend::Base> leaders;
        if (!leaders_or_none.is_none()) leaders = leaders_or_none.cast<c10::intrusive_ptr<lspawn_backend::Base>>();
        c10::intrusive_ptr<lspawn_backend::LspawnBackend> b;
        {
          py::gil_scoped_release nogil;  // the store and gloo wait for the other ranks
          b = c10::make_intrusive<lspawn_backend::LspawnBackend>(store, rank, size, std::chrono::milliseconds(timeout_ms),
                                                                 std::move(global_ranks), group_id, fallback,
                                                                 status_slot, std::move(rank_hosts), leaders);
        }
        return c10::intrusive_ptr<lspawn_backend::Base>(std::move(b));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("global_ranks"),
      py::arg("group_id"), py::arg("fallback"), py::arg("status_slot"), py::arg("rank_hosts"),
      py::arg("leaders"));
  // What a backend this module made says of itself, asked through any Python object that may hold one (a
  // ProcessGroup, a Backend): the object, not its id(), since torch may hand out a new Python wrapper of the
  // same backend each time (2.11 does).
  auto ours = [](const py::object& o) -> const lspawn_backend::LspawnBackend* {
    try {
      return dynamic_cast<const lspawn_backend::LspawnBackend*>(o.cast<c10::intrusive_ptr<lspawn_backend::Base>>().get());
    } catch (const py::cast_error&) {
      return nullptr;
    }
  };
  // "shm" | "shm+gloo" | "gloo", or None: not ours.
  m.def("transport", [ours](const py::object& o) -> py::object {
    const auto* b = ours(o);
    return b ? py::object(py::str(b->transport())) : py::object(py::none());
  });
  // {"lspawn": {op: n}, "gloo": {op: n}}, or None: not ours.
  m.def("counts", [ours](const py::object& o) -> py::object {
    const auto* b = ours(o);
    if (!b) return py::none();
    py::dict d;
    using Path = lspawn_backend::LspawnBackend::Path;
    d["lspawn"] = b->counts(Path::Lspawn);
    d["gloo"] = b->counts(Path::Gloo);
    d["cuda_ipc"] = b->counts(Path::CudaIpc);
    return d;
  });
  // "on" | "off: <why>" | "unused", or None: not ours.
  m.def("cuda_ipc", [ours](const py::object& o) -> py::object {
    const auto* b = ours(o);
    return b ? py::object(py::str(b->cuda_ipc_state())) : py::object(py::none());
  });
}
