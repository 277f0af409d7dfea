// The machine as --numa-binding sees it, read from sysfs (and, for GPU UUIDs, the NVIDIA driver's
// /proc entries): no LibTorch, no CUDA, no NVML. The roots are parameters so that tests build a
// machine of their own (2 sockets x 2 NUMA nodes x 8 GPUs, SMT on or off, offline CPUs).
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "placement/cpu_list.hpp"
#include "proto/error.hpp"

namespace lspawn::placement {

// A file that could not be read or parsed, named.
class TopologyError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

struct Cpu {
  int id = 0;
  int package = 0;  // topology/physical_package_id: the socket
  int core = 0;     // the lowest CPU of topology/thread_siblings_list: one per physical core
  int cache = 0;    // the lowest CPU sharing its highest-level data cache: one per core complex
  int numa_node = 0;
};

struct Gpu {
  std::string pci;    // "0000:1b:00.0"
  int numa_node = 0;  // its numa_node file; -1 (a machine of one node) reads as 0, as torch
  std::string model;  // the PCI device id ("0x2330")
  std::string uuid;   // "GPU-…" from /proc/driver/nvidia/gpus/<pci>/information; "" unknown
};

struct Topology {
  std::vector<Cpu> cpus;         // the online CPUs, by id
  std::map<int, CpuList> nodes;  // NUMA node -> its online CPUs
  std::vector<Gpu> gpus;         // NVIDIA GPUs in PCI bus order
  bool nodes_known = true;       // false: no devices/system/node (one node 0 assumed)
  bool caches_known = true;      // false: no cache/ directory (a node is one complex)
  const Cpu* cpu(int id) const;
};

// Reads `sys_root` ("/sys") and `proc_root` ("/proc"). Throws TopologyError naming the file.
Topology read_topology(const std::string& sys_root = "/sys", const std::string& proc_root = "/proc");

// The GPUs local ranks 0, 1, … use: CUDA_VISIBLE_DEVICES's entries in order (indices into
// CUDA's order, or UUIDs "GPU-…", prefixes allowed, as CUDA reads them), else every GPU. CUDA's
// order is PCI bus order with CUDA_DEVICE_ORDER=PCI_BUS_ID; its default (FASTEST_FIRST) is the
// same on a node of one model, and not knowable without CUDA otherwise: then a TopologyError
// asks for CUDA_DEVICE_ORDER=PCI_BUS_ID. `visible`/`order`: the variables, null when unset.
// Returns indices into topo.gpus. Throws TopologyError naming the variable and the entry.
std::vector<int> visible_gpus(const Topology& topo, const char* visible, const char* order);

}  // namespace lspawn::placement
