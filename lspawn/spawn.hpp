// Public entry of programmatic spawn: lspawn::spawn(), lspawn::init(), LSPAWN_REGISTER,
// SpawnOptions, ProcessContext, the exceptions, and lspawn::Codec for the torch-free types.
// Link lspawn::spawn. Documentation: docs/spawn.md; reference: spawn/spawn.hpp.
#pragma once

#include "spawn/codec.hpp"
#include "spawn/errors.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/init.hpp"
#include "spawn/options.hpp"
#include "spawn/process_context.hpp"
#include "spawn/registry.hpp"
#include "spawn/spawn.hpp"
