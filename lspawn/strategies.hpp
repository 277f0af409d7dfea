// Public entry of the training strategies: how a model is trained on one process, on several
// ranks (DDP, XLA-like), on workers fit() starts itself (DDPSpawn, XLASpawn) or on replicas in
// threads (DataParallel).
//
// What it declares (and everything of <lspawn/collectives.hpp> and <lspawn/runtime.hpp>):
//   - TrainingModule (steps, optimizers) and Strategy with its implementations: SingleDevice, DDP (c10d::Reducer), XLA, DDPSpawn,
//     XLASpawn, DataParallel; accelerators and precisions.
//   - Trainer: fit() / validate() / test() / predict() over a Strategy.
//   - data: TensorDataset, DistributedSampler, DataLoader, ParallelLoader; checkpoints.
// Link lspawn::strategies. Documentation: docs/strategies.md.
#pragma once

#include "lspawn/collectives.hpp"

#include "strategies/data_parallel.hpp"
#include "strategies/ddp.hpp"
#include "strategies/spawn_strategies.hpp"
#include "strategies/trainer.hpp"
#include "strategies/xla.hpp"
