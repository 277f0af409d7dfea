// ParallelStrategy: what every multi-process strategy (DDP, XLA) shares — joining the job, the
// lspawn::Group for Lightning's collective calls, rank numbers and the device of this rank.
//
// Two ways to get the group:
//   - default: setup_environment() calls runtime's init_process_group() (the env contract given
//     by `lspawn`, lspawn::spawn or torchrun) and builds a Group over it (Group::from_world);
//   - given: a Group the caller built (tests, or a program that already has one).
#pragma once

#include "collectives/group.hpp"
#include "collectives/strategy_ops.hpp"
#include "strategies/accelerator.hpp"
#include "strategies/strategy.hpp"

#include <chrono>
#include <memory>
#include <optional>

namespace lspawn {

struct World;

struct ParallelOptions {
  AcceleratorKind accelerator = AcceleratorKind::Auto;
  Precision precision = Precision::F32True;
  // Backend of the lspawn Group used for the strategy's collective calls (and for DDP's and
  // XLA's gradient all-reduce): Default → env LSPAWN_BACKEND; else NCCL when the strategy's
  // device is CUDA and this build has NCCL (torch's choice); else Auto (shm on one node, gloo
  // between nodes). See strategy_backend().
  Backend backend = Backend::Default;
  // Timeout of one collective. Zero → LSPAWN_PG_TIMEOUT, else 30 min.
  std::chrono::milliseconds timeout{0};
};

// The backend a strategy that joins the job itself asks for: `asked` when not Default; Default
// when env_backend (LSPAWN_BACKEND) is set, so the Group reads it; Nccl when `device` is CUDA and
// NCCL is built in (a GPU per rank, as with torch: NCCL refuses two ranks on one GPU, where
// LSPAWN_BACKEND=shm stages CUDA tensors through host memory instead); else Default.
Backend strategy_backend(Backend asked, c10::Device device, bool nccl_built, const char* env_backend);
// Whether the local ranks of such a strategy may share a CUDA device: not when its collectives on
// a CUDA model would be NCCL's (strategy_backend() gives Nccl, or LSPAWN_BACKEND=nccl), else they
// may (cuda:LOCAL_RANK mod devices: 2 ranks on one GPU with LSPAWN_BACKEND=shm).
DeviceSharing strategy_device_sharing(Backend asked, bool nccl_built, const char* env_backend);

class ParallelStrategy : public Strategy {
 public:
  explicit ParallelStrategy(ParallelOptions options);
  // Uses `group` (all its members construct their strategy with it). local_rank < 0: LOCAL_RANK
  // from the environment, else the group rank.
  ParallelStrategy(std::shared_ptr<Group> group, ParallelOptions options, int local_rank = -1);
  ~ParallelStrategy() override;

  void setup_environment() override;
  c10::Device root_device() const override;

  int global_rank() const override;
  int local_rank() const override { return local_rank_; }
  int node_rank() const override { return node_rank_; }
  int world_size() const override;

  void barrier(const std::string& name = "") override;
  c10::IValue broadcast(const c10::IValue& obj, int src = 0) override;
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads = false) override;
  c10::IValue reduce(const c10::IValue& value, ReduceOp op = ReduceOp::Mean) override;
  bool reduce_boolean_decision(bool decision, bool all = true) override;

  // Need setup_environment(). std::logic_error before.
  Group& group() const;
  const ParallelOptions& options() const { return options_; }

 protected:
  StrategyCollectives& collectives() const;
  ParallelOptions options_;
  std::unique_ptr<World> world_;  // when this strategy joined the job itself
  std::shared_ptr<Group> group_;
  std::unique_ptr<StrategyCollectives> collectives_;
  std::optional<Accelerator> accelerator_;
  int local_rank_ = 0;
  int node_rank_ = 0;
};

}  // namespace lspawn
