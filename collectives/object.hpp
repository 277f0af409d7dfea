// Object collectives: move any value LibTorch can pickle (ints, doubles, strings, bools, lists,
// dicts with string/int keys, tuples, tensors, and nestings of these) between the ranks of a
// Group. Values travel as torch::pickle_save bytes; tensors inside objects come back on the CPU.
//
// Every call first exchanges a small header (op, root, byte count) with one all_gather, so a rank
// that calls a different object collective, or names another root, gets CollectiveMismatch
// naming the ranks, on every rank, instead of a hang or garbage. Cost: one small all_gather plus
// one all_gather (or broadcast) of the padded bytes; meant for metadata, not for bulk tensors.
#pragma once

#include "collectives/group.hpp"

#include <ATen/core/ivalue.h>

#include <vector>

namespace lspawn {

// Returns rank `src`'s `value` on every rank (on src, a copy of its own value).
c10::IValue broadcast_object(Group& g, const c10::IValue& value, int src);

// Returns every rank's `value`, in rank order.
std::vector<c10::IValue> all_gather_object(Group& g, const c10::IValue& value);

// On `dst`: every rank's value in rank order. Elsewhere: an empty vector.
std::vector<c10::IValue> gather_object(Group& g, const c10::IValue& value, int dst);

// Rank q gets values[q] of rank `src`. `values` must have size() elements on src (ignored elsewhere).
c10::IValue scatter_object(Group& g, const std::vector<c10::IValue>& values, int src);

// One bool per rank → one decision for all: with all = true, true iff every rank said true;
// with all = false, true iff any rank did. (Lightning's reduce_boolean_decision.)
bool reduce_boolean_decision(Group& g, bool decision, bool all = true);

}  // namespace lspawn
