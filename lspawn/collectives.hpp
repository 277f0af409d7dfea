// Public entry of the collectives: what a worker uses to compute together with the other ranks.
//
//   lspawn::World world = lspawn::init_process_group();
//   auto group = lspawn::Group::from_world(world);   // shm among the ranks of a node, gloo across
//   lspawn::all_reduce(*group, grad, lspawn::ReduceOp::Mean);
//
// What it declares (and everything of <lspawn/runtime.hpp>, which it includes):
//   - Group, GroupOptions, Backend: a set of ranks, its backends and store namespace, subgroups
//     (new_group()).
//   - the tensor collectives (all_reduce, broadcast, all_gather, reduce_scatter, send/recv, ...),
//     each with an _async form returning Work; ReduceOp.
//   - the object collectives (broadcast_object, all_gather_object, ...) and StrategyCollectives,
//     the calls a Lightning-style Strategy makes.
//   - CollectiveError, CollectiveTimeout, CollectiveMismatch: failures naming the op, the group
//     and the ranks concerned.
// The shared-memory communicator, the hierarchical levels and CUDA IPC behind a Group are lspawn's
// implementation (shm/, collectives/hierarchy.hpp, collectives/cuda_ipc.hpp), not
// part of this face. Link lspawn::collectives. Documentation: docs/collectives.md.
#pragma once

#include "lspawn/runtime.hpp"

#include "collectives/error.hpp"
#include "collectives/group.hpp"
#include "collectives/object.hpp"
#include "collectives/ops.hpp"
#include "collectives/reduce_op.hpp"
#include "collectives/strategy_ops.hpp"
#include "collectives/work.hpp"
