#include "placement/topology.hpp"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace lspawn::placement {

namespace {

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  while (!out->empty() && (out->back() == '\n' || out->back() == ' ')) out->pop_back();
  return true;
}

std::string must_read(const std::string& path) {
  std::string s;
  if (!read_file(path, &s)) throw TopologyError("--numa-binding: cannot read " + path);
  return s;
}

int to_int(const std::string& s, const std::string& path) {
  try {
    size_t used = 0;
    const int v = std::stoi(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {}
  throw TopologyError("--numa-binding: " + path + " holds '" + s + "', not an integer");
}

CpuList must_read_list(const std::string& path) {
  try {
    return parse_cpu_list(must_read(path), path);
  } catch (const std::invalid_argument& e) {
    throw TopologyError(std::string("--numa-binding: ") + e.what());
  }
}

std::vector<std::string> entries(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The lowest CPU sharing `cpu`'s highest-level data or unified cache; -1 when it has no cache/.
int cache_key(const std::string& cpu_dir) {
  int best_level = -1, key = -1;
  for (const std::string& idx : entries(cpu_dir + "/cache", "index")) {
    if (!all_digits(idx.substr(5))) continue;
    const std::string d = cpu_dir + "/cache/" + idx;
    std::string type;
    if (!read_file(d + "/type", &type) || (type != "Unified" && type != "Data")) continue;
    const int level = to_int(must_read(d + "/level"), d + "/level");
    if (level <= best_level) continue;
    const CpuList shared = must_read_list(d + "/shared_cpu_list");
    if (shared.empty()) continue;
    best_level = level;
    key = shared.front();
  }
  return key;
}

}  // namespace

const Cpu* Topology::cpu(int id) const {
  for (const Cpu& c : cpus) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

Topology read_topology(const std::string& sys_root, const std::string& proc_root) {
  Topology t;
  const std::string cpu_root = sys_root + "/devices/system/cpu";
  const CpuList online = must_read_list(cpu_root + "/online");
  // NUMA nodes first: each CPU's node is where a node's cpulist names it.
  const std::string node_root = sys_root + "/devices/system/node";
  std::map<int, int> node_of_cpu;
  for (const std::string& n : entries(node_root, "node")) {
    if (!all_digits(n.substr(4))) continue;
    const int node = std::stoi(n.substr(4));
    const CpuList cpus = intersect(must_read_list(node_root + "/" + n + "/cpulist"), online);
    t.nodes[node] = cpus;
    for (int c : cpus) node_of_cpu[c] = node;
  }
  if (t.nodes.empty()) {  // a kernel without NUMA: one node, every CPU
    t.nodes_known = false;
    t.nodes[0] = online;
  }
  for (int id : online) {
    const std::string d = cpu_root + "/cpu" + std::to_string(id);
    Cpu c;
    c.id = id;
    c.package = to_int(must_read(d + "/topology/physical_package_id"), d + "/topology/physical_package_id");
    std::string siblings;
    if (!read_file(d + "/topology/thread_siblings_list", &siblings) &&
        !read_file(d + "/topology/core_cpus_list", &siblings)) {
      throw TopologyError("--numa-binding: cannot read " + d + "/topology/thread_siblings_list");
    }
    CpuList sib;
    try {
      sib = intersect(parse_cpu_list(siblings, d + "/topology/thread_siblings_list"), online);
    } catch (const std::invalid_argument& e) {
      throw TopologyError(std::string("--numa-binding: ") + e.what());
    }
    c.core = sib.empty() ? id : sib.front();
    const auto n = node_of_cpu.find(id);
    c.numa_node = n == node_of_cpu.end() ? (t.nodes_known ? -1 : 0) : n->second;
    c.cache = cache_key(d);
    t.cpus.push_back(c);
  }
  for (Cpu& c : t.cpus) {
    if (c.cache < 0) {
      t.caches_known = false;
      c.cache = -1 - c.numa_node;  // one complex per node
    }
  }
  // NVIDIA GPUs: vendor 0x10de, class display (0x0300xx) or 3D controller (0x0302xx).
  const std::string pci_root = sys_root + "/bus/pci/devices";
  for (const std::string& addr : entries(pci_root, "")) {
    if (addr == "." || addr == "..") continue;
    const std::string d = pci_root + "/" + addr;
    std::string vendor, cls;
    if (!read_file(d + "/vendor", &vendor) || vendor != "0x10de") continue;
    if (!read_file(d + "/class", &cls) || (cls.compare(0, 6, "0x0300") != 0 && cls.compare(0, 6, "0x0302") != 0))
      continue;
    Gpu g;
    g.pci = addr;
    std::string node;
    g.numa_node = read_file(d + "/numa_node", &node) ? std::max(to_int(node, d + "/numa_node"), 0) : 0;
    read_file(d + "/device", &g.model);
    std::string info;
    if (read_file(proc_root + "/driver/nvidia/gpus/" + addr + "/information", &info)) {
      std::istringstream in(info);
      for (std::string line; std::getline(in, line);) {
        if (line.compare(0, 9, "GPU UUID:") != 0) continue;
        std::string v = line.substr(9);
        v.erase(0, v.find_first_not_of(" \t"));
        g.uuid = v;
      }
    }
    t.gpus.push_back(g);
  }
  return t;
}

std::vector<int> visible_gpus(const Topology& topo, const char* visible, const char* order) {
  const bool pci_order = order && std::string(order) == "PCI_BUS_ID";
  std::set<std::string> models;
  for (const Gpu& g : topo.gpus) models.insert(g.model);
  std::vector<int> all;
  for (size_t i = 0; i < topo.gpus.size(); ++i) all.push_back(static_cast<int>(i));
  if (!pci_order && models.size() > 1) {
    std::string list;
    for (const auto& m : models) list += (list.empty() ? "" : ", ") + m;
    throw TopologyError("--numa-binding: this node has GPUs of " + std::to_string(models.size()) +
                        " models (PCI device ids " + list +
                        "), whose order in CUDA's default (FASTEST_FIRST) lspawn cannot know without CUDA; "
                        "set CUDA_DEVICE_ORDER=PCI_BUS_ID");
  }
  if (!visible) return all;
  // As CUDA reads it: entries up to the first that names no device.
  std::vector<int> out;
  std::stringstream ss(visible);
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(0, item.find_first_not_of(" "));
    item.erase(item.find_last_not_of(" ") + 1);
    int found = -1;
    if (all_digits(item)) {
      const int i = std::stoi(item);
      if (i < static_cast<int>(topo.gpus.size())) found = i;
    } else if (item.compare(0, 4, "GPU-") == 0) {
      for (size_t i = 0; i < topo.gpus.size(); ++i) {
        if (!topo.gpus[i].uuid.empty() && topo.gpus[i].uuid.compare(0, item.size(), item) == 0)
          found = static_cast<int>(i);
      }
      if (found < 0) {
        throw TopologyError("--numa-binding: CUDA_VISIBLE_DEVICES='" + std::string(visible) +
                            "': no GPU of this node has the UUID " + item +
                            " (read from /proc/driver/nvidia/gpus/*/information)");
      }
    } else if (item.compare(0, 4, "MIG-") == 0) {
      throw TopologyError("--numa-binding: CUDA_VISIBLE_DEVICES='" + std::string(visible) +
                          "': MIG instances are not placed by lspawn (give GPU indices or UUIDs)");
    }
    if (found < 0) break;
    out.push_back(found);
  }
  return out;
}

}  // namespace lspawn::placement
