// DDPSpawn and XLASpawn: strategies whose fit() starts the workers itself with lspawn::spawn
// (Lightning's DDPSpawnStrategy / TPUSpawnStrategy; torch_xla's xmp.spawn).
//
//   LSPAWN_REGISTER_SPAWN_FIT(Net);                  // once, at namespace scope (Spawn/Forkserver)
//   int main(int argc, char** argv) {
//     lspawn::init(argc, argv);                       // a worker started by exec runs and exits here
//     auto net = std::make_shared<Net>();
//     lspawn::SpawnStrategyOptions so;
//     so.nprocs = 4;
//     lspawn::DDPSpawn strategy(so);
//     lspawn::SpawnFitResult r = strategy.fit(net, train, val, trainer_options);
//     // net now holds rank 0's trained weights; r: rank 0's metrics and last checkpoint path
//   }
//
// What happens in fit():
//   - the module goes to the workers in a ModelWrapper (Fork: the caller's object, shared
//     copy-on-write; Spawn/Forkserver: one snapshot file mapped by every worker; M must be
//     default-constructible then), the data sets as tensors, the options as JSON text;
//   - worker `index` (index first, as xmp.spawn) builds the in-worker strategy (DDP or XLA) from
//     the env contract spawn() gives it, runs Trainer::fit on its shard, and rank 0 returns its
//     module state, metrics and last checkpoint path (SpawnOptions::results = Rank0);
//   - the caller loads rank 0's state into its module and returns rank 0's results;
//   - a worker that fails stops the others; fit() throws spawn's ProcessRaisedException /
//     ProcessExitedException naming the process ("process 1 terminated with ...").
// nprocs = 1 runs in the calling process (spawn() starts no child) on SingleDevice, unless the
// caller itself is a worker of a job (WORLD_SIZE set), in which case it joins that job.
// XLASpawn differs in the in-worker strategy (XLA: gradients all-reduced at optimizer_step,
// batches prefetched by a ParallelLoader thread) and in running prepare_data, when given, once
// per node under a SerialExecutor before training (MpSerialExecutor).
#pragma once

#include "spawn/spawn.hpp"
#include "runtime/spawn/model_wrapper.hpp"
#include "runtime/spawn/tensor_codec.hpp"
#include "strategies/ddp.hpp"
#include "strategies/trainer.hpp"
#include "strategies/xla.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace lspawn {

struct SpawnStrategyOptions {
  int nprocs = 2;
  StartMethod start_method = StartMethod::Spawn;
  DDPOptions ddp;  // DDP's options (XLASpawn uses the ParallelOptions part)
  // Extra SpawnOptions (env, output sinks, grace period); nprocs, start_method and results are
  // set by the strategy.
  SpawnOptions spawn;
};

// Everything a spawned worker needs besides the module and the data (crosses as JSON text).
struct SpawnFitConfig {
  std::string kind;  // "ddp" | "xla"
  DDPOptions ddp;
  TrainerOptions trainer;
  LoaderOptions train_loader, val_loader;
  bool has_val = false;
  int64_t fit_started_ns = 0;  // steady clock of the caller at fit() (same clock in every process)
  std::string serial_marker;   // XLASpawn: a file created once per node under the SerialExecutor
};
std::string to_json_text(const SpawnFitConfig& c);
SpawnFitConfig spawn_fit_config_from_json(const std::string& text);

// What rank 0 sends back: module state, metrics, last checkpoint, epochs, global step, and the
// steady-clock time of the end of its first optimizer step.
using SpawnFitReturn = std::tuple<std::map<std::string, at::Tensor>, std::map<std::string, double>, std::string,
                                  int64_t, int64_t, int64_t>;

// Builds the in-worker strategy for `c` (DDP or XLA over the env contract).
std::unique_ptr<Strategy> make_worker_strategy(const SpawnFitConfig& c);
// Runs the trainer in a worker and packs rank 0's return value (others return an empty one).
SpawnFitReturn run_spawn_fit(int index, TrainingModule& module, const SpawnFitConfig& c,
                             const std::vector<at::Tensor>& train, const std::vector<at::Tensor>& val);

// The function every spawned worker runs (registered per module type by LSPAWN_REGISTER_SPAWN_FIT).
template <class M>
SpawnFitReturn spawn_fit_worker(int index, ModelWrapper<M> model, std::string config, std::vector<at::Tensor> train,
                                std::vector<at::Tensor> val) {
  const SpawnFitConfig c = spawn_fit_config_from_json(config);
  return run_spawn_fit(index, *model.get(), c, train, val);
}

struct SpawnFitResult : FitResult {
  // Seconds from fit() in the caller to the end of rank 0's first optimizer step.
  double time_to_first_step = 0;
};

class SpawnStrategyBase {
 public:
  explicit SpawnStrategyBase(std::string kind, SpawnStrategyOptions options)
      : kind_(std::move(kind)), options_(std::move(options)) {}

  template <class M>
  SpawnFitResult fit(const std::shared_ptr<M>& module, const DataLoader& train,
                     const std::optional<DataLoader>& val = std::nullopt, TrainerOptions trainer = {}) {
    SpawnFitConfig c;
    c.kind = kind_;
    c.ddp = options_.ddp;
    c.trainer = trainer;
    c.train_loader = train.options();
    c.has_val = val.has_value();
    if (val) c.val_loader = val->options();
    c.serial_marker = serial_marker_;
    const auto started = std::chrono::steady_clock::now();
    c.fit_started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(started.time_since_epoch()).count();
    SpawnOptions o = options_.spawn;
    o.nprocs = options_.nprocs;
    o.start_method = options_.start_method;
    o.results = ResultFrom::Rank0;
    std::vector<at::Tensor> val_tensors = val ? val->dataset().tensors() : std::vector<at::Tensor>{};
    auto ctx = lspawn::spawn(
        &spawn_fit_worker<M>,
        std::make_tuple(ModelWrapper<M>(module), to_json_text(c), train.dataset().tensors(), std::move(val_tensors)),
        o);
    auto results = ctx.template results<SpawnFitReturn>();
    if (results.empty() || !results[0]) throw std::runtime_error(kind_ + "Spawn::fit: rank 0 returned no result");
    return unpack(*module, *results[0], c.fit_started_ns);
  }

  const SpawnStrategyOptions& options() const { return options_; }

 protected:
  static SpawnFitResult unpack(torch::nn::Module& module, const SpawnFitReturn& r, int64_t started_ns);
  std::string kind_;
  SpawnStrategyOptions options_;
  std::string serial_marker_;
};

// fit() in the caller; DDP in every worker.
class DDPSpawn : public SpawnStrategyBase {
 public:
  explicit DDPSpawn(SpawnStrategyOptions options = {}) : SpawnStrategyBase("ddp", std::move(options)) {}
};

// fit() in the caller; XLA in every worker. `serial_marker`: when not empty, each worker runs
// the node's data preparation step under a SerialExecutor: the first one to get the lock
// creates this file (so exactly one worker per node "prepares", the others find it done).
class XLASpawn : public SpawnStrategyBase {
 public:
  explicit XLASpawn(SpawnStrategyOptions options = {}, std::string serial_marker = "")
      : SpawnStrategyBase("xla", std::move(options)) {
    serial_marker_ = std::move(serial_marker);
  }
};

}  // namespace lspawn

// Registers the spawn worker of module type M (needed for Spawn and Forkserver start methods).
#define LSPAWN_REGISTER_SPAWN_FIT(M) LSPAWN_REGISTER(::lspawn::spawn_fit_worker<M>)
