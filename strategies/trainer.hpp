// Trainer: fit / validate / test / predict over a Strategy (a small Lightning Trainer).
//
//   lspawn::DDP ddp;
//   lspawn::TrainerOptions o;  o.max_epochs = 10;  o.checkpoint_dir = "ckpt";
//   lspawn::Trainer trainer(ddp, o);
//   lspawn::FitResult r = trainer.fit(*net, train_loader, val_loader);
//   auto test = trainer.test(*net, test_loader);            // {"test_acc": 0.97, ...}
//
// fit():
//   - strategy.setup(module), module.configure_optimizers(), loaders through
//     strategy.process_dataloader() (each rank its shard; set_epoch(e) before each epoch);
//   - per batch: strategy.zero_grad, training_step, backward, optimizer_step; with
//     accumulate_grad_batches = k, the first k-1 batches of each group run under no_sync and only
//     the k-th steps (DDP then reduces the accumulated gradients once);
//   - per epoch: validation when a val loader is given; the mean train loss (over every sample
//     of every rank) and the throughput (samples/s, all ranks) printed by global rank 0 only;
//     a checkpoint when checkpoint_dir is set: "<dir>/last.ckpt" (and "<dir>/epoch=E.ckpt"
//     when keep_every_epoch), written atomically by global rank 0, followed by a barrier;
//   - resume: resume_from names a checkpoint; every rank loads it, restores model and optimizer,
//     and training continues at the next epoch with the same data order an uninterrupted run
//     would have had (the sampler's shuffle depends only on seed + epoch).
//   - A step that throws: strategy.on_exception(e), then the exception propagates (the process
//     exits with it; lspawn names the rank; peers waiting in a collective fail or are stopped).
// Metrics returned: the last epoch's "train_loss", the validation metrics ("val_<name>"), the
// epoch count; step metrics are averaged over samples across every rank.
// A progress bar (one line per epoch, redrawn) is drawn by global rank 0 when stderr is a
// terminal and progress_bar is true.
#pragma once

#include "strategies/strategy.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace lspawn {

struct TrainerOptions {
  int64_t max_epochs = 1;
  int64_t accumulate_grad_batches = 1;
  std::string checkpoint_dir;  // "" → no checkpoints
  bool keep_every_epoch = false;
  std::string resume_from;   // "" → fresh start
  bool progress_bar = true;  // only drawn on a terminal
  bool print_epochs = true;  // "epoch 3/10: train_loss 0.1234, 5321 samples/s" on rank 0
};

struct FitResult {
  std::map<std::string, double> metrics;
  std::string last_checkpoint;  // "" when no checkpoint was written
  int64_t epochs = 0;           // epochs completed (including resumed ones)
  int64_t global_step = 0;
  int64_t first_step_ns = 0;  // steady clock (ns) at the end of this run's first optimizer step
};

class Trainer {
 public:
  Trainer(Strategy& strategy, TrainerOptions options = {}) : strategy_(strategy), options_(std::move(options)) {}

  FitResult fit(TrainingModule& module, const DataLoader& train, const std::optional<DataLoader>& val = std::nullopt);
  // Mean of validation_step / test_step metrics over every sample of every rank, names prefixed
  // "val_" / "test_". Set the module up first when fit() did not run.
  std::map<std::string, double> validate(TrainingModule& module, const DataLoader& loader);
  std::map<std::string, double> test(TrainingModule& module, const DataLoader& loader);
  // This rank's predictions, concatenated in its shard's order (no gathering).
  at::Tensor predict(TrainingModule& module, const DataLoader& loader);

  Strategy& strategy() { return strategy_; }
  const TrainerOptions& options() const { return options_; }

 private:
  std::map<std::string, double> evaluate(TrainingModule& module, const DataLoader& loader, bool test,
                                         const std::string& prefix);
  void ensure_setup(TrainingModule& module);
  Strategy& strategy_;
  TrainerOptions options_;
};

}  // namespace lspawn
