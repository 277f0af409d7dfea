// Public entry of the worker runtime: what a worker program gets from lspawn.
//
//   lspawn::World world = lspawn::init_process_group();  // env contract -> rendezvous -> gloo|nccl
//   world.pg->allreduce(tensors)->wait();                 // c10d::ProcessGroup over every rank
//   int main(int argc, char** argv) { return lspawn::run_main(argc, argv, train); }
//
// What it declares:
//   - WorkerEnv, EnvError: the environment contract a launcher (lspawn, torchrun, Slurm) gives
//     each worker, strictly parsed (docs/env-contract.md).
//   - init_process_group(), InitOptions, World, PeerInfo, have_nccl(): the job's store and its
//     process group; ProcessGroupError, RendezvousError, RendezvousTimeout name what failed.
//   - run_main(), record(), install_error_handler(), write_error_report(): a worker that dies of
//     an exception leaves an error report the launcher prints as the root cause
//     (docs/error-reports.md).
// The store gate, the record authentication and the gloo guard behind it are lspawn's
// implementation (runtime/rendezvous.hpp and the headers it includes), not part of this face.
// Link lspawn::runtime. Documentation: docs/runtime.md.
#pragma once

#include "runtime/error_report.hpp"
#include "runtime/process_group.hpp"
#include "runtime/rendezvous_outcome.hpp"
#include "runtime/worker_env.hpp"
