#include "strategies/data_parallel.hpp"

#include "runtime/torch_compat.hpp"

#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <exception>
#include <thread>

namespace lspawn {

namespace {

std::string device_name(const c10::Device& d) { return d.str(); }

// The gradient of one root parameter from its replicas: the sum of the replicas' gradients,
// moved to the root's device (torch's ReduceAdd, which also skips replicas whose gradient is
// undefined: a replica that had no rows this step, or a parameter its step did not use).
class ReplicaGradSum : public torch::autograd::Node {
 public:
  explicit ReplicaGradSum(c10::Device root) : root_(root) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor sum;
    for (auto& g : grads) {
      if (!g.defined()) continue;
      if (!sum.defined())
        sum = g.to(root_, /*non_blocking=*/false, /*copy=*/true);
      else
        sum.add_(g.to(root_));
    }
    return {sum};
  }
  std::string name() const override { return "lspawn::DataParallelGradSum"; }

 private:
  c10::Device root_;
};

c10::Device normalise(const c10::Device& d) {
  if (d.is_cpu()) return c10::Device(c10::kCPU);
  if (d.is_cuda() && !d.has_index())
    throw std::invalid_argument("DataParallel: device '" + d.str() + "' has no index (write cuda:0, cuda:1, …)");
  if (!d.is_cuda()) throw std::invalid_argument("DataParallel: device '" + d.str() + "' is neither CPU nor CUDA");
  return d;
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

ReplicaError::ReplicaError(int replica, c10::Device device, const std::string& step, const std::string& message)
    : lspawn::Error("DataParallel: replica " + std::to_string(replica) + " on device " + device_name(device) +
                    " failed in " + step + ": " + message),
      replica_(replica),
      device_(device) {}

// One batch split for the replicas: parts[i] is replica i's batch, rows[i] its row count.
struct DataParallel::Chunks {
  std::vector<Batch> parts;
  std::vector<int64_t> rows;
  int64_t total = 0;
};

DataParallel::DataParallel(std::vector<c10::Device> devices, DataParallelOptions options)
    : requested_(std::move(devices)), options_(options) {}

DataParallel::DataParallel(const std::vector<int>& cuda_devices, DataParallelOptions options) : options_(options) {
  for (int i : cuda_devices) requested_.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
}

DataParallel::~DataParallel() { teardown(); }

void DataParallel::setup_environment() {
  if (environment_ready_) return;
  std::vector<c10::Device> devices;
  if (requested_.empty()) {
    const int count = Accelerator::device_count(AcceleratorKind::Cuda);
    for (int i = 0; i < count; ++i) devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    if (devices.empty()) devices.emplace_back(c10::kCPU);
  } else {
    for (const auto& d : requested_) devices.push_back(normalise(d));
  }
  const int visible = devices.front().is_cuda() ? Accelerator::device_count(AcceleratorKind::Cuda) : 0;
  for (const auto& d : devices) {
    if (d.type() != devices.front().type())
      throw std::invalid_argument("DataParallel: devices mix " + devices.front().str() + " and " + d.str() +
                                  " (all CPU or all CUDA)");
    if (d.is_cuda() && d.index() >= visible)
      throw std::invalid_argument("DataParallel: device " + d.str() + " asked for, but " + std::to_string(visible) +
                                  " CUDA device(s) are visible");
  }
  devices_ = std::move(devices);
  if (devices_.front().is_cuda()) Accelerator::choose(AcceleratorKind::Cuda, devices_.front().index()).setup_device();
  environment_ready_ = true;
}

c10::Device DataParallel::root_device() const {
  if (!devices_.empty()) return devices_.front();
  if (!requested_.empty()) return normalise(requested_.front());
  return Accelerator::choose(AcceleratorKind::Auto, 0).device();
}

void DataParallel::teardown() { replicas_.clear(); }

void DataParallel::setup(TrainingModule& module) {
  setup_environment();
  replicas_.clear();
  model_to_device(module);
  attach(module, options_.precision);
  if (devices_.size() < 2) return;

  const auto root_params = module.named_parameters(/*recurse=*/true);
  const auto root_buffers = module.named_buffers(/*recurse=*/true);
  // One summing node per trainable root parameter, its next edge the parameter's accumulator.
  using NodePtr = decltype(compat::make_autograd_node<ReplicaGradSum>(c10::Device(c10::kCPU)));
  std::vector<NodePtr> nodes;
  for (const auto& p : root_params) {
    if (!p.value().requires_grad()) {
      nodes.emplace_back();
      continue;
    }
    auto node = compat::make_autograd_node<ReplicaGradSum>(p.value().device());
    node->set_next_edges(torch::autograd::collect_next_edges(p.value()));
    nodes.push_back(std::move(node));
  }
  for (std::size_t r = 1; r < devices_.size(); ++r) {
    std::shared_ptr<TrainingModule> replica = module.make_replica();
    if (!replica || replica.get() == &module)
      throw std::logic_error("DataParallel: make_replica() must return a new module (replica " + std::to_string(r) +
                             ")");
    auto params = replica->named_parameters(true);
    auto buffers = replica->named_buffers(true);
    if (params.size() != root_params.size() || buffers.size() != root_buffers.size())
      throw std::invalid_argument("DataParallel: make_replica() built a module with " + std::to_string(params.size()) +
                                  " parameters and " + std::to_string(buffers.size()) + " buffers; the module has " +
                                  std::to_string(root_params.size()) + " and " + std::to_string(root_buffers.size()));
    {
      at::NoGradGuard no_grad;
      auto check_and_copy = [](const std::string& kind, const std::string& name, at::Tensor& dst,
                               const at::Tensor& src) {
        if (dst.sizes() != src.sizes() || dst.scalar_type() != src.scalar_type())
          throw std::invalid_argument("DataParallel: make_replica() built " + kind + " '" + name + "' as " +
                                      std::string(c10::toString(dst.scalar_type())) + c10::str(dst.sizes()) +
                                      ", the module has " + std::string(c10::toString(src.scalar_type())) +
                                      c10::str(src.sizes()));
        dst.copy_(src);
      };
      for (const auto& p : root_params) {
        auto* dst = params.find(p.key());
        if (dst == nullptr)
          throw std::invalid_argument("DataParallel: make_replica() built a module without parameter '" + p.key() +
                                      "'");
        check_and_copy("parameter", p.key(), *dst, p.value());
      }
      for (const auto& b : root_buffers) {
        auto* dst = buffers.find(b.key());
        if (dst == nullptr)
          throw std::invalid_argument("DataParallel: make_replica() built a module without buffer '" + b.key() + "'");
        check_and_copy("buffer", b.key(), *dst, b.value());
      }
    }
    replica->to(devices_[r]);
    replica->train(module.is_training());
    // The replica's parameters stop being leaves: their gradient goes to the root's, summed.
    std::size_t i = 0;
    params = replica->named_parameters(true);  // after to(): same tensors, possibly new data
    for (const auto& p : root_params) {
      at::Tensor t = params[p.key()];
      if (nodes[i])
        torch::autograd::set_history(t, nodes[i]);
      else
        t.set_requires_grad(false);
      ++i;
    }
    replicas_.push_back(std::move(replica));
  }
}

DataParallel::Chunks DataParallel::scatter(const Batch& batch) const {
  Chunks c;
  const auto n = static_cast<int64_t>(devices_.size());
  int64_t rows = -1;
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const auto& t = batch[k];
    if (!t.defined() || t.dim() == 0) continue;
    if (rows < 0)
      rows = t.size(0);
    else if (t.size(0) != rows)
      throw std::invalid_argument("DataParallel: batch tensor " + std::to_string(k) + " has " +
                                  std::to_string(t.size(0)) + " rows, tensor 0 has " + std::to_string(rows) +
                                  " (they are split along dim 0 together)");
  }
  if (rows <= 0 || n < 2) {  // nothing to split: the root takes the batch as it is
    c.parts.push_back(batch);
    c.rows.push_back(std::max<int64_t>(rows, 0));
    c.total = c.rows.back();
    return c;
  }
  const int64_t per = (rows + n - 1) / n;  // tensor.chunk(n): ceil(rows / n) per chunk
  const int64_t used = (rows + per - 1) / per;
  c.parts.resize(used);
  for (int64_t r = 0; r < used; ++r) {
    const int64_t begin = r * per, len = std::min(per, rows - begin);
    c.rows.push_back(len);
    auto& part = c.parts[r];
    for (const auto& t : batch) {
      if (!t.defined())
        part.push_back(t);
      else if (t.dim() == 0)
        part.push_back(t.to(devices_[r]));
      else
        part.push_back(t.narrow(0, begin, len).to(devices_[r], /*non_blocking=*/true));
    }
  }
  c.total = rows;
  return c;
}

void DataParallel::sync_replicas(std::size_t count) {
  if (count < 2) return;
  auto& root = module();
  at::NoGradGuard no_grad;
  const auto params = root.named_parameters(true);
  const auto buffers = root.named_buffers(true);
  for (std::size_t r = 1; r < count; ++r) {
    auto& replica = *replicas_[r - 1];
    auto rp = replica.named_parameters(true);
    auto rb = replica.named_buffers(true);
    for (const auto& p : params) rp[p.key()].copy_(p.value(), /*non_blocking=*/true);
    for (const auto& b : buffers) rb[b.key()].copy_(b.value(), /*non_blocking=*/true);
    if (replica.is_training() != root.is_training()) replica.train(root.is_training());
  }
}

// Runs fn(replica module, batch, index) for every chunk: chunk 0 on this thread, the others
// on one thread each; every thread is joined before the first failure (by replica index) is
// thrown as ReplicaError.
template <typename R, typename F>
std::vector<R> DataParallel::parallel_apply(const Chunks& chunks, const char* step, F&& fn) {
  const std::size_t n = chunks.parts.size();
  std::vector<R> out(n);
  std::vector<std::exception_ptr> errors(n);
  sync_replicas(n);
  auto run = [&](std::size_t i) {
    try {
      TrainingModule& m = i == 0 ? module() : *replicas_[i - 1];
      c10::OptionalDeviceGuard guard;
      if (!devices_[i].is_cpu()) guard.reset_device(devices_[i]);
      auto scope = precision_plugin().forward_context();
      out[i] = fn(m, chunks.parts[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  if (n == 1) {
    // One chunk: no thread, and the module's own exception unchanged (as SingleDevice).
    TrainingModule& m = module();
    auto scope = precision_plugin().forward_context();
    out[0] = fn(m, chunks.parts[0]);
    return out;
  }
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  {
    const at::ThreadLocalState state;  // grad mode, dispatch keys (autocast), … of the caller
    for (std::size_t i = 1; i < n; ++i) {
      try {
        threads.emplace_back([&, i] {
          at::ThreadLocalStateGuard tls(state);
          run(i);
        });
      } catch (...) {  // a thread that could not start: that replica failed
        errors[i] = std::current_exception();
      }
    }
    run(0);
    for (auto& t : threads) t.join();
  }
  for (std::size_t i = 0; i < n; ++i)
    if (errors[i]) throw ReplicaError(static_cast<int>(i), devices_[i], step, message_of(errors[i]));
  return out;
}

at::Tensor DataParallel::training_step(const Batch& batch, int64_t batch_idx) {
  const Chunks chunks = scatter(batch);
  auto losses = parallel_apply<at::Tensor>(chunks, "training_step", [&](TrainingModule& m, const Batch& b) {
    at::Tensor loss = m.training_step(b, batch_idx);
    if (!loss.defined() || loss.numel() != 1)
      throw std::invalid_argument("training_step must return a scalar loss, got " +
                                  (loss.defined() ? c10::str(loss.sizes()) : std::string("an undefined tensor")));
    return loss;
  });
  if (losses.size() == 1) return losses[0];
  // Gather onto the root (differentiable copies), then reduce.
  const auto root = devices_.front();
  std::vector<at::Tensor> gathered;
  for (auto& l : losses) gathered.push_back(l.reshape({}).to(root));
  at::Tensor stacked = at::stack(gathered);
  if (options_.reduction == LossReduction::Mean) return stacked.mean();
  auto weights =
      at::tensor(chunks.rows, at::TensorOptions().dtype(at::kDouble)).div_(static_cast<double>(chunks.total));
  return (stacked * weights.to(stacked.options())).sum();
}

StepMetrics DataParallel::reduce_metrics(const std::vector<StepMetrics>& outputs, const Chunks& chunks,
                                         const char* step) const {
  if (outputs.size() == 1) return outputs[0];
  StepMetrics out;
  const auto root = devices_.front();
  for (const auto& [name, first] : outputs[0]) {
    std::vector<at::Tensor> values;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      auto it = outputs[i].find(name);
      if (it == outputs[i].end())
        throw std::invalid_argument(std::string("DataParallel: ") + step + " of replica " + std::to_string(i) +
                                    " has no metric '" + name + "' (replica 0 has)");
      values.push_back(it->second.reshape({}).to(root, at::kDouble));
    }
    at::Tensor stacked = at::stack(values);
    at::Tensor v =
        options_.reduction == LossReduction::Mean
            ? stacked.mean()
            : (stacked * at::tensor(chunks.rows, stacked.options())).sum() / static_cast<double>(chunks.total);
    out[name] = v.to(first.scalar_type());
  }
  return out;
}

StepMetrics DataParallel::validation_step(const Batch& batch, int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  const Chunks chunks = scatter(batch);
  auto outs = parallel_apply<StepMetrics>(
      chunks, "validation_step", [&](TrainingModule& m, const Batch& b) { return m.validation_step(b, batch_idx); });
  return reduce_metrics(outs, chunks, "validation_step");
}

StepMetrics DataParallel::test_step(const Batch& batch, int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  const Chunks chunks = scatter(batch);
  auto outs = parallel_apply<StepMetrics>(chunks, "test_step",
                                          [&](TrainingModule& m, const Batch& b) { return m.test_step(b, batch_idx); });
  return reduce_metrics(outs, chunks, "test_step");
}

at::Tensor DataParallel::predict_step(const Batch& batch, int64_t batch_idx) {
  torch::NoGradGuard no_grad;
  const Chunks chunks = scatter(batch);
  auto outs = parallel_apply<at::Tensor>(
      chunks, "predict_step", [&](TrainingModule& m, const Batch& b) { return m.predict_step(b, batch_idx); });
  if (outs.size() == 1) return outs[0];
  for (auto& o : outs) o = o.to(devices_.front());
  return at::cat(outs, 0);
}

}  // namespace lspawn
