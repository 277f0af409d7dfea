// --numa-binding's placement (placement/): torchrun 2.15's modes on machines built as sysfs trees.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <string>
#include <vector>

#include "placement/binding.hpp"
#include "placement/cpu_list.hpp"
#include "placement/topology.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"

using namespace lspawn::placement;
using lspawn::test::TempDir;
using lspawn::test::write_file;

namespace {

void mkdirs(const std::string& path) {
  std::string p;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      p = path.substr(0, i);
      ::mkdir(p.c_str(), 0755);
    }
  }
}
void put(const std::string& path, const std::string& text) {
  mkdirs(path.substr(0, path.rfind('/')));
  write_file(path, text + "\n");
}

// A machine: `sockets` x `nodes_per_socket` NUMA nodes of `cores_per_node` cores; with SMT each
// core c has the siblings c and c + total cores; a core complex (one L3) is `ccx` cores; GPUs
// `gpus_per_node` per node, PCI addresses in node order. `offline`: CPUs left out of online.
struct Machine {
  int sockets = 2, nodes_per_socket = 2, cores_per_node = 8, ccx = 4, gpus_per_node = 2;
  bool smt = true;
  std::vector<int> offline;
  std::vector<std::string> models;  // per GPU; default all "0x2330"
  int cores() const { return sockets * nodes_per_socket * cores_per_node; }
  int cpus() const { return cores() * (smt ? 2 : 1); }
  void build(const std::string& root) const {
    const std::string sys = root + "/sys", cpu = sys + "/devices/system/cpu";
    CpuList online;
    for (int c = 0; c < cpus(); ++c) {
      if (std::find(offline.begin(), offline.end(), c) == offline.end()) online.push_back(c);
    }
    put(cpu + "/online", cpu_list_text(online));
    const int n_nodes = sockets * nodes_per_socket;
    for (int node = 0; node < n_nodes; ++node) {
      CpuList list;
      for (int k = 0; k < cores_per_node; ++k) {
        list.push_back(node * cores_per_node + k);
        if (smt) list.push_back(node * cores_per_node + k + cores());
      }
      std::sort(list.begin(), list.end());
      put(sys + "/devices/system/node/node" + std::to_string(node) + "/cpulist",
          cpu_list_text(intersect(list, online)));
    }
    for (int c = 0; c < cpus(); ++c) {
      const int core = c % cores(), node = core / cores_per_node;
      const std::string d = cpu + "/cpu" + std::to_string(c);
      put(d + "/topology/physical_package_id", std::to_string(node / nodes_per_socket));
      put(d + "/topology/thread_siblings_list",
          smt ? std::to_string(core) + "," + std::to_string(core + cores()) : std::to_string(core));
      put(d + "/cache/index0/type", "Data");
      put(d + "/cache/index0/level", "1");
      put(d + "/cache/index0/shared_cpu_list", std::to_string(c));
      put(d + "/cache/index1/type", "Instruction");
      put(d + "/cache/index1/level", "1");
      put(d + "/cache/index1/shared_cpu_list", std::to_string(c));
      const int first = core / ccx * ccx;
      CpuList l3;
      for (int k = first; k < first + ccx; ++k) {
        l3.push_back(k);
        if (smt) l3.push_back(k + cores());
      }
      std::sort(l3.begin(), l3.end());
      put(d + "/cache/index3/type", "Unified");
      put(d + "/cache/index3/level", "3");
      put(d + "/cache/index3/shared_cpu_list", cpu_list_text(l3));
    }
    int g = 0;
    for (int node = 0; node < n_nodes; ++node) {
      for (int k = 0; k < gpus_per_node; ++k, ++g) {
        char addr[32];
        std::snprintf(addr, sizeof addr, "0000:%02x:00.0", 0x1b + 0x20 * node + k);
        const std::string d = sys + "/bus/pci/devices/" + addr;
        put(d + "/vendor", "0x10de");
        put(d + "/class", "0x030200");
        put(d + "/device", models.empty() ? "0x2330" : models[static_cast<size_t>(g)]);
        put(d + "/numa_node", std::to_string(node));
        put(root + "/proc/driver/nvidia/gpus/" + addr + "/information",
            "Model: \t NVIDIA H100\nGPU UUID: \t GPU-" + std::to_string(g) + "aaa-bbbb\nBus Location: \t " + addr);
      }
    }
    // Something else on the bus: not a GPU.
    put(sys + "/bus/pci/devices/0000:00:1f.0/vendor", "0x8086");
    put(sys + "/bus/pci/devices/0000:00:1f.0/class", "0x060100");
  }
  Topology read(const TempDir& dir) const {
    build(dir.path);
    return read_topology(dir.path + "/sys", dir.path + "/proc");
  }
};

CpuList L(const std::string& s) { return parse_cpu_list(s, "test"); }
CpuList all(const Topology& t) {
  CpuList out;
  for (const Cpu& c : t.cpus) out.push_back(c.id);
  return out;
}

}  // namespace

TEST_CASE("cpu lists: the kernel's format both ways, bad ones named", "[placement]") {
  CHECK(L("0-3,8,10-11\n") == CpuList{0, 1, 2, 3, 8, 10, 11});
  CHECK(L("") == CpuList{});
  CHECK(L("5,1,1") == CpuList{1, 5});
  CHECK(cpu_list_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(cpu_list_text({}) == "");
  for (const char* bad : {"a", "1-", "3-1", "1,,2", "0,", "99999"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_cpu_list(bad, "LSPAWN_CPUS"), Catch::StartsWith("LSPAWN_CPUS: "));
  }
}

TEST_CASE("topology: 2 sockets x 2 NUMA nodes, SMT, 8 GPUs read from a sysfs tree", "[placement]") {
  TempDir dir;
  const Topology t = Machine{}.read(dir);
  CHECK(t.cpus.size() == 64);
  CHECK(t.nodes.size() == 4);
  CHECK(t.nodes.at(1) == L("8-15,40-47"));
  CHECK(t.gpus.size() == 8);  // the Intel bridge is not one
  CHECK(t.gpus[2].pci == "0000:3b:00.0");
  CHECK(t.gpus[2].numa_node == 1);
  CHECK(t.gpus[2].uuid == "GPU-2aaa-bbbb");
  CHECK(t.cpu(40)->core == 8);  // sibling of core 8
  CHECK(t.cpu(40)->package == 0);
  CHECK(t.cpu(20)->package == 1);
  CHECK(t.cpu(13)->cache == 12);  // the L3 of cores 12-15
  CHECK(t.caches_known);
}

TEST_CASE("numa-binding node and socket: each rank by its GPU's NUMA node", "[placement]") {
  TempDir dir;
  const Topology t = Machine{}.read(dir);
  const auto gpus = visible_gpus(t, nullptr, nullptr);
  auto p = place(t, Mode::Node, 8, gpus, all(t));
  CHECK(p[0].cpus == L("0-7,32-39"));
  CHECK(p[1].cpus == L("0-7,32-39"));
  CHECK(p[5].cpus == L("16-23,48-55"));
  CHECK(p[5].numa_node == 2);
  CHECK(p[5].gpu == 5);
  p = place(t, Mode::Socket, 8, gpus, all(t));
  CHECK(p[0].cpus == L("0-15,32-47"));
  CHECK(p[7].cpus == L("16-31,48-63"));
  CHECK(placement_text(t, {p[0]}, 8) == "rank 8: CPUs 0-15,32-47 (NUMA node 0, GPU 0000:1b:00.0)");
}

TEST_CASE("numa-binding exclusive: the node's cores split between its GPUs, siblings together", "[placement]") {
  TempDir dir;
  Machine m;
  const Topology t = m.read(dir);
  auto p = place(t, Mode::Exclusive, 8, visible_gpus(t, nullptr, nullptr), all(t));
  CHECK(p[0].cpus == L("0-3,32-35"));
  CHECK(p[1].cpus == L("4-7,36-39"));
  CHECK(p[7].cpus == L("28-31,60-63"));
  // Three GPUs of a node sharing 8 cores: 3, 3, 2.
  TempDir dir3;
  Machine three;
  three.gpus_per_node = 3;
  const Topology t3 = three.read(dir3);
  p = place(t3, Mode::Exclusive, 3, visible_gpus(t3, nullptr, nullptr), all(t3));
  CHECK(p[0].cpus == L("0-2,32-34"));
  CHECK(p[1].cpus == L("3-5,35-37"));
  CHECK(p[2].cpus == L("6-7,38-39"));
}

TEST_CASE("numa-binding exclusive without SMT, and with offline CPUs", "[placement]") {
  TempDir dir;
  Machine m;
  m.smt = false;
  m.offline = {3, 4};
  const Topology t = m.read(dir);
  CHECK(t.cpus.size() == 30);
  auto p = place(t, Mode::Exclusive, 2, visible_gpus(t, nullptr, nullptr), all(t));
  // Node 0 has cores 0-2, 5-7 online: 3 each.
  CHECK(p[0].cpus == L("0-2"));
  CHECK(p[1].cpus == L("5-7"));
}

TEST_CASE("numa-binding core-complex: one L3 per GPU of the node, largest first", "[placement]") {
  TempDir dir;
  Machine m;
  m.offline = {0, 32};  // core 0 gone: the complex of cores 1-3 is now the smaller one
  const Topology t = m.read(dir);
  auto p = place(t, Mode::CoreComplex, 4, visible_gpus(t, nullptr, nullptr), all(t));
  CHECK(p[0].cpus == L("4-7,36-39"));
  CHECK(p[1].cpus == L("1-3,33-35"));
  CHECK(p[2].cpus == L("8-11,40-43"));
  CHECK(p[3].cpus == L("12-15,44-47"));
}

TEST_CASE("numa-binding with CUDA_VISIBLE_DEVICES: indices, UUIDs, and what cannot be placed", "[placement]") {
  TempDir dir;
  const Topology t = Machine{}.read(dir);
  auto gpus = visible_gpus(t, "6,7", nullptr);
  REQUIRE(gpus == std::vector<int>{6, 7});
  auto p = place(t, Mode::Exclusive, 2, gpus, all(t));
  CHECK(p[0].cpus == L("24-27,56-59"));
  CHECK(p[1].cpus == L("28-31,60-63"));
  CHECK(visible_gpus(t, "GPU-3aaa,0", nullptr) == std::vector<int>{3, 0});
  CHECK(visible_gpus(t, "1,9,2", nullptr) == std::vector<int>{1});  // CUDA stops at the first bad entry
  CHECK(visible_gpus(t, "", nullptr).empty());                      // no GPU: placed without
  CHECK_THROWS_WITH(visible_gpus(t, "GPU-ffff", nullptr), Catch::Contains("no GPU of this node has the UUID GPU-ffff"));
  CHECK_THROWS_WITH(visible_gpus(t, "MIG-1", nullptr), Catch::Contains("MIG instances"));
  CHECK_THROWS_WITH(place(t, Mode::Node, 3, gpus, all(t)),
                    Catch::Contains("3 local ranks but 2 visible GPUs (local rank r is placed by GPU r)"));
  // Two models: CUDA's default order is unknown without CUDA.
  TempDir dir2;
  Machine mixed;
  mixed.models = {"0x2330", "0x2330", "0x2331", "0x2331", "0x2330", "0x2330", "0x2330", "0x2330"};
  const Topology t2 = mixed.read(dir2);
  CHECK_THROWS_WITH(visible_gpus(t2, nullptr, nullptr), Catch::Contains("set CUDA_DEVICE_ORDER=PCI_BUS_ID"));
  CHECK(visible_gpus(t2, nullptr, "PCI_BUS_ID").size() == 8);
}

TEST_CASE("numa-binding without GPUs: ranks in blocks over the NUMA nodes lspawn may use", "[placement]") {
  TempDir dir;
  const Topology t = Machine{}.read(dir);
  auto p = place(t, Mode::Node, 8, {}, all(t));
  CHECK(p[0].numa_node == 0);
  CHECK(p[1].numa_node == 0);
  CHECK(p[2].numa_node == 1);
  CHECK(p[7].numa_node == 3);
  CHECK(p[0].gpu == -1);
  p = place(t, Mode::Exclusive, 8, {}, all(t));
  CHECK(p[0].cpus == L("0-3,32-35"));
  CHECK(p[1].cpus == L("4-7,36-39"));
  // A cpuset narrower than the machine (node 0 and half of node 1): only those, split.
  const CpuList allowed = L("0-11,32-43");
  p = place(t, Mode::Exclusive, 4, {}, allowed);
  CHECK(p[0].cpus == L("0-3,32-35"));
  CHECK(p[1].cpus == L("4-7,36-39"));
  CHECK(p[2].cpus == L("8-9,40-41"));
  CHECK(p[3].cpus == L("10-11,42-43"));
  p = place(t, Mode::Node, 2, {}, allowed);
  CHECK(p[1].cpus == L("8-11,40-43"));  // node 1's CPUs that lspawn may use
  CHECK_THROWS_WITH(place(t, Mode::Exclusive, 20, {}, L("0-3")),
                    Catch::Contains("NUMA node 0 has 4 physical cores lspawn may use for 20 ranks"));
}

TEST_CASE("topology: what cannot be read is named", "[placement]") {
  TempDir dir;
  CHECK_THROWS_WITH(read_topology(dir.path + "/sys", dir.path + "/proc"),
                    Catch::Contains("cannot read " + dir.path + "/sys/devices/system/cpu/online"));
  Machine{}.build(dir.path);
  put(dir.path + "/sys/devices/system/node/node1/cpulist", "8-x");
  CHECK_THROWS_WITH(read_topology(dir.path + "/sys", dir.path + "/proc"), Catch::Contains("node1/cpulist: '8-x'"));
}

TEST_CASE("topology: without NUMA nodes or caches in sysfs, one node and one complex", "[placement]") {
  TempDir dir;
  put(dir.path + "/sys/devices/system/cpu/online", "0-3");
  for (int c = 0; c < 4; ++c) {
    put(dir.path + "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/physical_package_id", "0");
    put(dir.path + "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list",
        std::to_string(c));
  }
  const Topology t = read_topology(dir.path + "/sys", dir.path + "/proc");
  CHECK_FALSE(t.nodes_known);
  CHECK_FALSE(t.caches_known);
  CHECK(t.gpus.empty());
  auto p = place(t, Mode::CoreComplex, 2, {}, L("0-3"));
  CHECK(p[0].cpus == L("0-3"));
  p = place(t, Mode::Exclusive, 2, {}, L("0-3"));
  CHECK(p[1].cpus == L("2-3"));
}

TEST_CASE("topology: this machine's /sys, placed within this process's CPUs", "[placement]") {
  const Topology t = read_topology();
  REQUIRE_FALSE(t.cpus.empty());
  const CpuList allowed = current_affinity();
  for (Mode m : {Mode::Node, Mode::Socket, Mode::CoreComplex}) {
    auto p = place(t, m, 2, {}, allowed);
    for (const auto& r : p) {
      CHECK_FALSE(r.cpus.empty());
      CHECK(intersect(r.cpus, allowed) == r.cpus);
    }
  }
}
