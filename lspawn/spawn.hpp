// Public entry of programmatic spawn: start worker processes from C++ and get their results back,
// as torch.multiprocessing.spawn does. No LibTorch.
//
//   LSPAWN_REGISTER(train);                              // train(int index, args...)
//   int main(int argc, char** argv) {
//     lspawn::init(argc, argv);                          // in a worker started by exec: runs it
//     auto ctx = lspawn::spawn(train, std::make_tuple(10, std::string("run")), options);
//   }
//
// What it declares:
//   - spawn(), SpawnOptions, StartMethod (Fork, Spawn, Forkserver), ResultFrom, ProcessContext
//     (join, terminate, results<R>(), workers(): a WorkerResult per worker).
//   - init() and StartupOptions: the first line of main in a program that calls spawn().
//   - LSPAWN_REGISTER and the FunctionRegistry it fills; lspawn::Codec for the torch-free
//     argument and result types (tensors: <lspawn/tensor_codec.hpp>).
//   - SpawnError, HangError, ProcessRaisedException, ProcessExitedException.
//   - Forkserver, for SpawnOptions::forkserver (Forkserver::start(), before threads exist).
// What init() records for lspawn's own use (spawn/init_detail.hpp), the fork loop and the
// Supervisor are lspawn's implementation, not part of this face.
// Link lspawn::spawn. Documentation: docs/spawn.md.
#pragma once

#include "spawn/codec.hpp"
#include "spawn/errors.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/init.hpp"
#include "spawn/options.hpp"
#include "spawn/process_context.hpp"
#include "spawn/registry.hpp"
#include "spawn/spawn.hpp"
