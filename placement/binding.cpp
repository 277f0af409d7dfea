#include "placement/binding.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace lspawn::placement {

std::optional<Mode> parse_mode(const std::string& s) {
  if (s == "node") return Mode::Node;
  if (s == "socket") return Mode::Socket;
  if (s == "exclusive") return Mode::Exclusive;
  if (s == "core-complex") return Mode::CoreComplex;
  return std::nullopt;
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Node: return "node";
    case Mode::Socket: return "socket";
    case Mode::Exclusive: return "exclusive";
    case Mode::CoreComplex: return "core-complex";
  }
  return "?";
}

namespace {

CpuList node_cpus(const Topology& t, int node, const CpuList& allowed) {
  const auto it = t.nodes.find(node);
  return it == t.nodes.end() ? CpuList{} : intersect(it->second, allowed);
}

// Groups `cpus` by `key` (core or cache), groups ordered by their key.
std::map<int, CpuList> group_by(const Topology& t, const CpuList& cpus, int Cpu::*key) {
  std::map<int, CpuList> out;
  for (int id : cpus) {
    const Cpu* c = t.cpu(id);
    out[c ? c->*key : id].push_back(id);
  }
  return out;
}

CpuList exclusive(const Topology& t, int node, const CpuList& cpus, int index, int count) {
  const auto cores = group_by(t, cpus, &Cpu::core);
  const int ncores = static_cast<int>(cores.size());
  if (ncores < count) {
    throw TopologyError("--numa-binding exclusive: NUMA node " + std::to_string(node) + " has " +
                        std::to_string(ncores) + " physical core" + (ncores == 1 ? "" : "s") + " lspawn may use for " +
                        std::to_string(count) + " ranks; use --numa-binding node, or fewer ranks");
  }
  const int per = ncores / count, extra = ncores % count;
  const int start = index * per + std::min(index, extra);
  const int end = start + per + (index < extra ? 1 : 0);
  CpuList out;
  int i = 0;
  for (const auto& [core, ids] : cores) {
    if (i >= start && i < end) out.insert(out.end(), ids.begin(), ids.end());
    ++i;
  }
  std::sort(out.begin(), out.end());
  return out;
}

CpuList core_complex(const Topology& t, const CpuList& cpus, int index) {
  const auto by_cache = group_by(t, cpus, &Cpu::cache);
  std::vector<std::pair<int, CpuList>> caches(by_cache.begin(), by_cache.end());
  std::stable_sort(caches.begin(), caches.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.second.front() < b.second.front();
  });
  if (caches.empty()) return {};
  return caches[static_cast<size_t>(index) % caches.size()].second;
}

}  // namespace

std::vector<Placement> place(const Topology& t, Mode mode, int nlocal, const std::vector<int>& gpus,
                             const CpuList& allowed) {
  std::vector<Placement> out(static_cast<size_t>(std::max(nlocal, 0)));
  // Each rank's NUMA node, and its index among the "devices" of that node (GPUs, or ranks).
  std::vector<int> node_of(out.size()), index_on_node(out.size()), count_on_node(out.size());
  if (!gpus.empty()) {
    if (nlocal > static_cast<int>(gpus.size())) {
      throw TopologyError("--numa-binding: " + std::to_string(nlocal) + " local ranks but " +
                          std::to_string(gpus.size()) + " visible GPU" + (gpus.size() == 1 ? "" : "s") +
                          " (local rank r is placed by GPU r)");
    }
    std::map<int, std::vector<int>> on_node;  // node -> visible GPU positions
    for (size_t v = 0; v < gpus.size(); ++v)
      on_node[t.gpus[static_cast<size_t>(gpus[v])].numa_node].push_back(static_cast<int>(v));
    for (int r = 0; r < nlocal; ++r) {
      const int node = t.gpus[static_cast<size_t>(gpus[static_cast<size_t>(r)])].numa_node;
      const auto& list = on_node[node];
      node_of[r] = node;
      index_on_node[r] = static_cast<int>(std::find(list.begin(), list.end(), r) - list.begin());
      count_on_node[r] = static_cast<int>(list.size());
      out[r].gpu = gpus[static_cast<size_t>(r)];
    }
  } else {
    std::vector<int> usable;  // the nodes with CPUs lspawn may use
    for (const auto& [node, cpus] : t.nodes) {
      if (!intersect(cpus, allowed).empty()) usable.push_back(node);
    }
    if (usable.empty())
      throw TopologyError("--numa-binding: no NUMA node has a CPU lspawn may use (" + cpu_list_text(allowed) + ")");
    const int k = static_cast<int>(usable.size());
    std::vector<int> block(out.size());
    for (int r = 0; r < nlocal; ++r) block[r] = static_cast<int>(static_cast<long long>(r) * k / nlocal);
    for (int r = 0; r < nlocal; ++r) {
      node_of[r] = usable[static_cast<size_t>(block[r])];
      index_on_node[r] = static_cast<int>(std::count(block.begin(), block.begin() + r, block[r]));
      count_on_node[r] = static_cast<int>(std::count(block.begin(), block.end(), block[r]));
    }
  }
  for (int r = 0; r < nlocal; ++r) {
    Placement& p = out[static_cast<size_t>(r)];
    p.local_rank = r;
    p.numa_node = node_of[r];
    const CpuList on_node = node_cpus(t, node_of[r], allowed);
    switch (mode) {
      case Mode::Node: p.cpus = on_node; break;
      case Mode::Socket: {
        if (on_node.empty()) break;
        const int package = t.cpu(on_node.front())->package;
        std::set<int> nodes;
        for (const Cpu& c : t.cpus) {
          if (c.package == package) nodes.insert(c.numa_node);
        }
        for (int n : nodes) {
          const CpuList more = node_cpus(t, n, allowed);
          p.cpus.insert(p.cpus.end(), more.begin(), more.end());
        }
        std::sort(p.cpus.begin(), p.cpus.end());
        p.cpus.erase(std::unique(p.cpus.begin(), p.cpus.end()), p.cpus.end());
        break;
      }
      case Mode::Exclusive: p.cpus = exclusive(t, node_of[r], on_node, index_on_node[r], count_on_node[r]); break;
      case Mode::CoreComplex: p.cpus = core_complex(t, on_node, index_on_node[r]); break;
    }
    if (p.cpus.empty()) {
      throw TopologyError("--numa-binding " + std::string(mode_name(mode)) + ": local rank " + std::to_string(r) +
                          " would get no CPU: NUMA node " + std::to_string(node_of[r]) + " has none lspawn may use (" +
                          cpu_list_text(allowed) + ")");
    }
  }
  return out;
}

std::string placement_text(const Topology& t, const std::vector<Placement>& ps, int first_rank) {
  std::string out;
  for (const Placement& p : ps) {
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(first_rank + p.local_rank) + ": CPUs " + cpu_list_text(p.cpus) + " (NUMA node " +
           std::to_string(p.numa_node);
    if (p.gpu >= 0) out += ", GPU " + t.gpus[static_cast<size_t>(p.gpu)].pci;
    out += ")";
  }
  return out;
}

}  // namespace lspawn::placement
