#include "strategies/ddp.hpp"

#include "collectives/ops.hpp"
#include "runtime/torch_compat_reducer.hpp"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace lspawn {

namespace detail {

// Runs bucket all-reduces through lspawn's all_reduce on one thread: shared memory on one node,
// the hierarchy (shm on each node, gloo among the node leaders) across nodes. The group's
// collectives must be issued from one thread at a time; the autograd thread only queues them, so
// backward goes on while a bucket is being reduced.
class ShmHookWorker {
 public:
  explicit ShmHookWorker(std::shared_ptr<Group> group) : group_(std::move(group)), thread_([this] { loop(); }) {}
  ~ShmHookWorker() { stop(); }
  // Runs what is queued, then ends the thread and joins it; once stopped, nothing of the worker
  // touches a bucket or a future again. Idempotent; from the owner's thread.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  c10::intrusive_ptr<c10::ivalue::Future> submit(at::Tensor buffer) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(std::move(buffer), future);
    }
    cv_.notify_all();
    return future;
  }

 private:
  void loop() {
    for (;;) {
      std::pair<at::Tensor, c10::intrusive_ptr<c10::ivalue::Future>> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        at::Tensor& buffer = item.first;
        buffer.div_(group_->size());
        lspawn::all_reduce(*group_, buffer, ReduceOp::Sum);
        item.second->markCompleted(c10::IValue(buffer));
      } catch (...) {
        item.second->setError(std::current_exception());
      }
    }
  }
  std::shared_ptr<Group> group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<at::Tensor, c10::intrusive_ptr<c10::ivalue::Future>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace detail

namespace {

constexpr size_t kBroadcastBucketBytes = 250u * 1024 * 1024;  // torch's _DEFAULT_BUCKET_SIZE for module sync

// A C++ comm hook. Derives from CommHookInterface itself rather than CppCommHookInterface:
// the latter's parseHookResult calls c10d::detail::parseCppCommHookResult, which Debian's
// libtorch_cpu 1.13 does not export.
class ShmCommHook : public c10d::CommHookInterface {
 public:
  explicit ShmCommHook(std::shared_ptr<detail::ShmHookWorker> worker) : worker_(std::move(worker)) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return worker_->submit(bucket.getBufferRef());
  }
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return result.isTensor() ? result.toTensor() : result.toTensorVector().at(0);
  }

 private:
  std::shared_ptr<detail::ShmHookWorker> worker_;
};

}  // namespace

DDP::DDP(DDPOptions options) : ParallelStrategy(options), ddp_(options) {}

DDP::DDP(std::shared_ptr<Group> group, DDPOptions options, int local_rank)
    : ParallelStrategy(std::move(group), options, local_rank), ddp_(options) {}

DDP::~DDP() { teardown(); }

void DDP::teardown() {
  // The hook's thread first: a bucket it is still reducing (after a failed backward, say) is
  // finished or failed, and its future set, before the reducer that owns them goes.
  if (hook_worker_) hook_worker_->stop();
  reducer_.reset();
  hook_worker_.reset();
}

void DDP::setup(TrainingModule& module) {
  // A second setup() (the Trainer fitting another module) first ends the first one's reducer
  // and hook thread, in teardown()'s order.
  DDP::teardown();
  setup_environment();
  model_to_device(module);
  attach(module, ddp_.precision);
  const auto& pg = group().process_group();

  std::vector<at::Tensor> params;
  std::unordered_map<size_t, std::string> names;
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    names[params.size()] = p.key();
    params.push_back(p.value());
  }
  buffers_.clear();
  for (auto& b : module.named_buffers(true)) buffers_.push_back(b.value());

  // As torch's DDP constructor: same model everywhere, then rank 0's values everywhere.
  c10d::verify_params_across_processes(pg, params, c10::nullopt);
  {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> state;
    for (auto& p : module.parameters(true)) state.push_back(p);
    for (auto& b : buffers_) state.push_back(b);
    if (!state.empty()) c10d::broadcast_coalesced(pg, state, kBroadcastBucketBytes, 0);
  }

  if (params.empty()) {
    num_buckets_ = 0;
    return;
  }
  std::vector<size_t> caps = {static_cast<size_t>(ddp_.first_bucket_cap_bytes),
                              static_cast<size_t>(ddp_.bucket_cap_bytes)};
  auto [buckets, limits] =
      c10d::compute_bucket_assignment_by_size(params, caps, std::vector<bool>(params.size(), false));
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  num_buckets_ = buckets.size();

  compat::ReducerArgs args;
  args.params = params;
  args.bucket_indices = std::move(buckets);
  args.per_bucket_size_limits = std::move(limits);
  args.process_group = pg;
  args.bucket_bytes_cap = ddp_.bucket_cap_bytes;
  args.first_bucket_bytes_cap = ddp_.first_bucket_cap_bytes;
  args.find_unused_parameters = ddp_.find_unused_parameters;
  args.gradient_as_bucket_view = ddp_.gradient_as_bucket_view;
  args.param_names = std::move(names);
  reducer_ = compat::make_reducer(std::move(args));

  const bool shm_levels = group().shm() != nullptr || group().hierarchy() != nullptr;
  if (ddp_.shm_comm_hook && shm_levels && !root_device().is_cuda()) {
    auto worker = std::make_shared<detail::ShmHookWorker>(group_);
    reducer_->register_comm_hook(std::make_unique<ShmCommHook>(worker));
    hook_worker_ = worker;
  }
}

std::vector<at::Tensor> DDP::bucket_buffers() const {
  std::vector<at::Tensor> out;
  if (!reducer_) return out;
  for (const auto& bucket : reducer_->get_grad_buckets(/*return_zero_tensors=*/false))
    out.push_back(bucket.getBuffer());
  return out;
}

void DDP::zero_grad(torch::optim::Optimizer& optimizer) {
  if (!reducer_ || !ddp_.gradient_as_bucket_view) return Strategy::zero_grad(optimizer);
  const auto buckets = bucket_buffers();
  auto in_bucket = [&](const at::Tensor& grad) {
    return std::any_of(buckets.begin(), buckets.end(), [&](const at::Tensor& b) { return grad.is_alias_of(b); });
  };
  // The bucket views are set aside while the optimizer clears the other gradients its own way,
  // then zeroed in place and put back.
  std::vector<std::pair<at::Tensor, at::Tensor>> views;  // (parameter, its gradient)
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      at::Tensor& grad = p.mutable_grad();
      if (!grad.defined() || !in_bucket(grad)) continue;
      views.emplace_back(p, grad);
      grad.reset();
    }
  }
  auto put_back = [&] {
    for (auto& [param, grad] : views) param.mutable_grad() = grad;
  };
  try {
    Strategy::zero_grad(optimizer);
  } catch (...) {
    put_back();
    throw;
  }
  {
    at::NoGradGuard no_grad;
    for (auto& view : views) view.second.zero_();
  }
  put_back();
}

void DDP::sync_buffers() {
  if (!ddp_.broadcast_buffers || buffers_.empty() || world_size() == 1) return;
  at::NoGradGuard no_grad;
  c10d::broadcast_coalesced(group().process_group(), buffers_, kBroadcastBucketBytes, 0);
}

at::Tensor DDP::training_step(const Batch& batch, int64_t batch_idx) {
  auto& m = module();
  const bool sync = reducer_ && sync_ && at::GradMode::is_enabled();
  if (sync) {
    reducer_->prepare_for_forward();
    reducer_->rebuild_buckets();
  }
  sync_buffers();
  at::Tensor loss;
  {
    auto scope = precision_plugin().forward_context();
    loss = m.training_step(batch, batch_idx);
  }
  if (sync) {
    if (ddp_.find_unused_parameters)
      reducer_->prepare_for_backward({loss});
    else
      reducer_->prepare_for_backward({});
  }
  return loss;
}

}  // namespace lspawn
