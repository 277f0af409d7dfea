// SLURM_TASKS_PER_NODE (and SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE): the per-node
// counts in Slurm's run-length form, one entry per node of the allocation in node order.
//
//   list  := entry { ',' entry }
//   entry := NUM | NUM '(x' NUM ')'          (the count, then how many nodes in a row have it)
// "2(x3),1" -> {2, 2, 2, 1};  "4" -> {4};  "3,1" -> {3, 1}.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "launchenv/env_syntax_error.hpp"

namespace lspawn::slurm {

// Hard limit on the number of nodes described (bounds the expansion of "(xN)").
inline constexpr size_t kMaxNodeEntries = 1u << 20;

// Expands `text`, the value of `variable` (named in errors). Counts are 0..1'000'000, repeats
// 1..kMaxNodeEntries. Throws EnvSyntaxError on anything else (empty value or entry, missing ')',
// "(x0)", trailing text, more than kMaxNodeEntries nodes in all).
std::vector<int> expand_tasks_per_node(std::string_view text, const std::string& variable);

}  // namespace lspawn::slurm
