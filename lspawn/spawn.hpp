// Public entry of programmatic spawn: lspawn::spawn(), lspawn::init(), LSPAWN_REGISTER,
// SpawnOptions, ProcessContext, the exceptions, and lspawn::Codec for the torch-free types.
// Link lspawn::spawn. Documentation: docs/spawn.md; reference: launcher/spawn/spawn.hpp.
#pragma once

#include "launcher/spawn/codec.hpp"
#include "launcher/spawn/errors.hpp"
#include "launcher/spawn/forkserver.hpp"
#include "launcher/spawn/init.hpp"
#include "launcher/spawn/options.hpp"
#include "launcher/spawn/process_context.hpp"
#include "launcher/spawn/registry.hpp"
#include "launcher/spawn/spawn.hpp"
