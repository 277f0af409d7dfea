// Public entry of the training strategies: Strategy, SingleDevice, DDP, XLA, DDPSpawn, XLASpawn,
// DataParallel, the Trainer, data sharding and checkpoints. Link lspawn::strategies.
// Documentation: docs/strategies.md.
#pragma once

#include "strategies/data_parallel.hpp"
#include "strategies/ddp.hpp"
#include "strategies/spawn_strategies.hpp"
#include "strategies/trainer.hpp"
#include "strategies/xla.hpp"
