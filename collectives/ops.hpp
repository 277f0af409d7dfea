// Tensor collectives over an lspawn::Group.
//
// Every op comes in two forms: `op_async(...)` returns a Work (collectives/work.hpp) that must be
// wait()ed before the outputs are read; `op(...)` is op_async(...).wait(). Every member of the
// group calls the same ops in the same order with matching arguments (same dtype, same shape
// where the op says so, same root, same ReduceOp).
//
// Inputs: any dtype among float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool
// (bitwise ops only on integer and bool tensors); non-contiguous tensors are accepted (staged
// through a contiguous copy, copied back in wait()); zero-element tensors are accepted.
// Errors: std::invalid_argument for a call that is wrong on this rank alone (bad shape, bitwise
// op on a float tensor, root out of range); CollectiveError / CollectiveTimeout /
// CollectiveMismatch (collectives/error.hpp) for what involves the others.
//
// Backends: on a group with shm (Group::backend() == "shm+gloo"), all_reduce, all_reduce_coalesced,
// reduce, reduce_scatter, broadcast, all_gather and barrier run over shared memory for CPU
// tensors; gather, scatter, all_to_all, send and recv always use gloo. On a hierarchical group
// (Group::backend() == "hierarchical": members on several nodes), all_reduce (and reduce,
// reduce_scatter, all_reduce_coalesced), broadcast and all_gather of CPU tensors run in two levels
// (collectives/hierarchy.hpp); the rest uses flat gloo. Ops over shm or the hierarchy complete
// inside the *_async call.
#pragma once

#include "collectives/error.hpp"
#include "collectives/group.hpp"
#include "collectives/reduce_op.hpp"
#include "collectives/work.hpp"

#include <ATen/ATen.h>

#include <vector>

namespace lspawn {

// In place: `tensor` = op over all ranks' `tensor`.
Work all_reduce_async(Group& g, at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
void all_reduce(Group& g, at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

// One all_reduce over many tensors of one dtype (a gradient bucket): they are flattened into one
// buffer, reduced together, and copied back in wait(). Throws invalid_argument on mixed dtypes.
Work all_reduce_coalesced_async(Group& g, std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::Sum);
void all_reduce_coalesced(Group& g, std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::Sum);

// `tensor` on rank `dst` = op over all ranks' `tensor`; on other ranks it is left unspecified.
Work reduce_async(Group& g, at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::Sum);
void reduce(Group& g, at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::Sum);

// `tensor` on every rank = `tensor` of rank `src` (same shape and dtype everywhere).
Work broadcast_async(Group& g, at::Tensor& tensor, int src);
void broadcast(Group& g, at::Tensor& tensor, int src);

// output (shape (size, *input.shape), input's dtype) = every rank's input, stacked in rank order.
Work all_gather_async(Group& g, const at::Tensor& input, at::Tensor& output);
// Stacked form: returns a new (size, *input.shape) tensor (Lightning's all_gather).
at::Tensor all_gather(Group& g, const at::Tensor& input);
// List form: size tensors, element q from rank q.
std::vector<at::Tensor> all_gather_list(Group& g, const at::Tensor& input);

// On `dst`: output (size, *input.shape) = every rank's input; on other ranks output is ignored
// (may be undefined).
Work gather_async(Group& g, const at::Tensor& input, at::Tensor& output, int dst);
void gather(Group& g, const at::Tensor& input, at::Tensor& output, int dst);

// output on rank q = input[q] of rank `src` (input: (size, *output.shape) on src; ignored elsewhere).
Work scatter_async(Group& g, at::Tensor& output, const at::Tensor& input, int src);
void scatter(Group& g, at::Tensor& output, const at::Tensor& input, int src);

// output on rank q = op over ranks of input[q]; input (size, *output.shape).
Work reduce_scatter_async(Group& g, at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::Sum);
void reduce_scatter(Group& g, at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::Sum);

// Equal splits along dim 0 (its length divisible by size): output block p on rank q = input
// block q on rank p. input and output have the same shape and dtype.
Work all_to_all_async(Group& g, at::Tensor& output, const at::Tensor& input);
void all_to_all(Group& g, at::Tensor& output, const at::Tensor& input);

// Point to point. The receiver's tensor has the sender's shape and dtype; tags match pairs.
Work send_async(Group& g, const at::Tensor& tensor, int dst, int tag = 0);
void send(Group& g, const at::Tensor& tensor, int dst, int tag = 0);
Work recv_async(Group& g, at::Tensor& tensor, int src, int tag = 0);
void recv(Group& g, at::Tensor& tensor, int src, int tag = 0);

// Returns on every rank once all have entered.
Work barrier_async(Group& g);
void barrier(Group& g);

}  // namespace lspawn
