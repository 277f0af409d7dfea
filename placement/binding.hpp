// --numa-binding: which CPUs each local rank of a node runs on, with torchrun 2.15's meanings
// (torch.numa.binding.AffinityMode), computed from a Topology (topology.hpp) as a pure function.
//
// With GPUs, local rank r uses visible GPU r and is placed by that GPU's NUMA node:
//   node          every CPU of the node
//   socket        every CPU of every node of the node's socket
//   exclusive     the node's physical cores split evenly (in order) between the visible GPUs on
//                 that node, the first ones one core more when they do not divide; hyperthread
//                 siblings stay together; an error when a node has more GPUs than cores
//   core-complex  one group of cores sharing the highest-level cache (an L3: AMD's CCX) of the
//                 node, a different one per GPU of the node where there are enough, largest first
// Without GPUs (none on the node, or CUDA_VISIBLE_DEVICES empty) the ranks are spread over the
// NUMA nodes that have CPUs lspawn may use, in contiguous blocks (ranks 0-3 on node 0, 4-7 on node
// 1 for 8 ranks on 2 nodes), and the same modes apply with "the ranks on the node" for "the GPUs
// on the node". Every set is intersected with the CPUs lspawn may use (its affinity: a cpuset, a
// container's limit, taskset); a rank left with none is an error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "placement/cpu_list.hpp"
#include "placement/topology.hpp"

namespace lspawn::placement {

enum class Mode { Node, Socket, Exclusive, CoreComplex };

// "node", "socket", "exclusive", "core-complex"; nullopt otherwise.
std::optional<Mode> parse_mode(const std::string& s);
const char* mode_name(Mode m);

struct Placement {
  int local_rank = 0;
  CpuList cpus;
  int numa_node = 0;
  int gpu = -1;  // index into Topology::gpus; -1: placed without a GPU
};

// One Placement per local rank. `gpus`: visible_gpus()'s result (empty: place without GPUs);
// `allowed`: the CPUs lspawn may use. Throws TopologyError saying what cannot be placed.
std::vector<Placement> place(const Topology& topo, Mode mode, int nlocal, const std::vector<int>& gpus,
                             const CpuList& allowed);

// "rank 0: CPUs 0-15 (NUMA node 0, GPU 0000:1b:00.0); rank 1: …", ranks numbered from
// `first_rank` (the node's first global rank).
std::string placement_text(const Topology& topo, const std::vector<Placement>& p, int first_rank);

}  // namespace lspawn::placement
