#include "strategies/parallel.hpp"

#include "collectives/ops.hpp"
#include "runtime/process_group.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <stdexcept>

namespace lspawn {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// all_gather whose backward sends each rank the sum over ranks of the gradient of its own slice
// (Lightning's all_gather(sync_grads=True), torch.distributed.nn.all_gather).
struct AllGatherWithGrad : public torch::autograd::Function<AllGatherWithGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor input, Group* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return lspawn::all_gather(*group, input);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    at::Tensor g = grads[0].contiguous().clone();
    lspawn::all_reduce(*group, g, ReduceOp::Sum);
    return {g.select(0, group->rank()), at::Tensor()};
  }
};

}  // namespace

ParallelStrategy::ParallelStrategy(ParallelOptions options) : options_(options) {}

ParallelStrategy::ParallelStrategy(std::shared_ptr<Group> group, ParallelOptions options, int local_rank)
    : options_(options), group_(std::move(group)) {
  if (!group_) throw std::invalid_argument("ParallelStrategy: null group");
  local_rank_ = local_rank >= 0 ? local_rank : env_int("LOCAL_RANK", group_->rank());
  node_rank_ = env_int("GROUP_RANK", 0);
}

ParallelStrategy::~ParallelStrategy() = default;

Backend strategy_backend(Backend asked, c10::Device device, bool nccl_built, const char* env_backend) {
  if (asked != Backend::Default) return asked;
  if (env_backend && *env_backend) return Backend::Default;  // LSPAWN_BACKEND decides (Group)
  if (device.is_cuda() && nccl_built) return Backend::Nccl;
  return Backend::Default;
}

DeviceSharing strategy_device_sharing(Backend asked, bool nccl_built, const char* env_backend) {
  const Backend b = strategy_backend(asked, c10::Device(c10::kCUDA, 0), nccl_built, env_backend);
  const bool nccl = b == Backend::Nccl || (b == Backend::Default && env_backend && std::string(env_backend) == "nccl");
  return nccl ? DeviceSharing::OnePerProcess : DeviceSharing::Allowed;
}

void ParallelStrategy::setup_environment() {
  if (!group_) {
    // The device first: it decides the backend (NCCL on CUDA, as torch does), and NCCL binds to
    // the device that is current when its communicator is made.
    InitOptions init;
    init.timeout = options_.timeout;
    init.env = WorkerEnv::from_environment();
    accelerator_ = Accelerator::choose(
        options_.accelerator, init.env->local_rank,
        strategy_device_sharing(options_.backend, have_nccl_backend(), std::getenv("LSPAWN_BACKEND")));
    accelerator_->setup_device();
    const Backend backend =
        strategy_backend(options_.backend, accelerator_->device(), have_nccl_backend(), std::getenv("LSPAWN_BACKEND"));
    if (backend == Backend::Nccl) init.backend = "nccl";
    world_ = std::make_unique<World>(init_process_group(init));
    GroupOptions go;
    go.backend = backend;
    go.timeout = options_.timeout;
    group_ = Group::from_world(*world_, go);
    local_rank_ = world_->env.local_rank;
    node_rank_ = world_->env.group_rank;
  }
  if (!collectives_) collectives_ = std::make_unique<StrategyCollectives>(group_);
  if (!accelerator_) {
    accelerator_ =
        Accelerator::choose(options_.accelerator, local_rank_,
                            group_->backend() == "nccl" ? DeviceSharing::OnePerProcess : DeviceSharing::Allowed);
    accelerator_->setup_device();
  }
}

Group& ParallelStrategy::group() const {
  if (!group_) throw std::logic_error("strategy: setup_environment() has not been called (no process group)");
  return *group_;
}

StrategyCollectives& ParallelStrategy::collectives() const {
  if (!collectives_) throw std::logic_error("strategy: setup_environment() has not been called (no process group)");
  return *collectives_;
}

c10::Device ParallelStrategy::root_device() const {
  if (!accelerator_) throw std::logic_error("strategy: setup_environment() has not been called (no device)");
  return accelerator_->device();
}

int ParallelStrategy::global_rank() const { return group().rank(); }
int ParallelStrategy::world_size() const { return group().size(); }

void ParallelStrategy::barrier(const std::string& name) { collectives().barrier(name); }

c10::IValue ParallelStrategy::broadcast(const c10::IValue& obj, int src) { return collectives().broadcast(obj, src); }

at::Tensor ParallelStrategy::all_gather(const at::Tensor& tensor, bool sync_grads) {
  if (sync_grads && tensor.requires_grad()) return AllGatherWithGrad::apply(tensor, group_.get());
  return collectives().all_gather(tensor);
}

c10::IValue ParallelStrategy::reduce(const c10::IValue& value, ReduceOp op) { return collectives().reduce(value, op); }

bool ParallelStrategy::reduce_boolean_decision(bool decision, bool all) {
  return collectives().reduce_boolean_decision(decision, all);
}

}  // namespace lspawn
