#include "ranks.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <sstream>
#include <stdexcept>

#include "spawn/threads.hpp"
#include "support/child.hpp"
#include "support/ports.hpp"
#include "support/temp_dir.hpp"
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

namespace lspawn::test {
namespace {

// LSPAWN_TEST_NODES="0,0,1,1": rank r runs as if on node nodes[r]: LSPAWN_NODE_ID (what Group
// compares) and the env contract's GROUP_RANK, GROUP_WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE;
// gloo binds to loopback (LSPAWN_GLOO_HOST), since every "node" is this machine.
void fake_node(std::map<std::string, std::string>& vars, const std::string& spec, int r, int n) {
  std::vector<int> nodes;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) nodes.push_back(std::stoi(item));
  if (static_cast<int>(nodes.size()) != n)
    throw std::invalid_argument("LSPAWN_TEST_NODES='" + spec + "' must list one node per rank (" + std::to_string(n) +
                                ")");
  int local = 0, local_size = 0, count = 0;
  for (int q = 0; q < n; ++q) {
    if (nodes[q] == nodes[r]) {
      if (q < r) ++local;
      ++local_size;
    }
    if (std::find(nodes.begin(), nodes.begin() + q, nodes[q]) == nodes.begin() + q) ++count;
  }
  vars["LSPAWN_NODE_ID"] = "fake-node-" + std::to_string(nodes[r]);
  vars["GROUP_RANK"] = std::to_string(nodes[r]);
  vars["GROUP_WORLD_SIZE"] = std::to_string(count);
  vars["LOCAL_RANK"] = std::to_string(local);
  vars["LOCAL_WORLD_SIZE"] = std::to_string(local_size);
  vars["LSPAWN_GLOO_HOST"] = "127.0.0.1";
}

}  // namespace

std::string RunResult::all_output() const {
  std::string s;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    s += "--- rank " + std::to_string(r) + " (exit " + std::to_string(ranks[r].exit_code) + ", signal " +
         std::to_string(ranks[r].signal) + ")\n" + ranks[r].output;
  }
  return s;
}

RunResult run_ranks(const Worker& worker, int n, const std::string& scenario, const std::string& backend,
                    const std::map<std::string, std::string>& env, std::chrono::seconds deadline) {
  // The ranks start before the store's server does, so that a forked rank comes from a process
  // with one thread (the server has its own). A forked rank waits for the end of `gate` (closed
  // once the server listens on the port reserved here) before it runs the worker's main.
  const ReservedPort port;
  const char* exec_ranks = std::getenv("LSPAWN_TEST_EXEC_RANKS");
  const bool fork_ranks =
      worker.main != nullptr && !(exec_ranks && std::string(exec_ranks) == "1") && count_threads() == 1;
  auto gate = sys::make_pipe("run_ranks start gate");
  const TempDir dir("lspawn-collectives-test-");
  std::vector<ChildProcess> ranks;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    std::map<std::string, std::string> vars = env;
    if (const auto it = env.find("LSPAWN_TEST_NODES"); it != env.end()) fake_node(vars, it->second, r, n);
    vars["RANK"] = std::to_string(r);
    vars["WORLD_SIZE"] = std::to_string(n);
    vars["MASTER_ADDR"] = "127.0.0.1";
    vars["MASTER_PORT"] = std::to_string(port.port());
    vars["OMP_NUM_THREADS"] = "1";
    const std::string log = dir.file("rank" + std::to_string(r) + ".log");
    const std::vector<std::string> argv = {worker.path, scenario, backend};
    if (fork_ranks) {
      ranks.emplace_back(
          [&worker, &gate, argv] {
            gate.write.reset();
            char byte;
            while (::read(gate.read.get(), &byte, 1) < 0 && errno == EINTR) {}
            std::vector<std::string> strings = argv;
            std::vector<char*> args;
            for (auto& a : strings) args.push_back(a.data());
            args.push_back(nullptr);
            return worker.main(static_cast<int>(argv.size()), args.data());
          },
          vars, log, ChildProcess::Inherit::all);
    } else {
      ranks.emplace_back(argv, vars, log, ChildProcess::Inherit::all);
    }
  }

  c10d::TCPStoreOptions so;
  so.port = port.port();
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  gate.write.reset();

  // One deadline for all: each rank waits for what is left of it (a rank past it is SIGKILLed).
  RunResult result;
  result.ranks.resize(n);
  const auto end = start + deadline;
  for (int r = 0; r < n; ++r) {
    const auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()));
    const ExitStatus st = ranks[r].wait_or_kill(left);
    result.timed_out = result.timed_out || st.timed_out;
    result.ranks[r].exit_code = st.exited ? st.code : -1;
    result.ranks[r].signal = st.exited ? 0 : st.signal;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < n; ++r) result.ranks[r].output = ranks[r].output();
  return result;
}

void require_all_ok(const RunResult& r) {
  INFO(r.all_output());
  REQUIRE_FALSE(r.timed_out);
  for (const auto& rank : r.ranks) {
    CHECK(rank.signal == 0);
    CHECK(rank.exit_code == 0);
  }
}

}  // namespace lspawn::test
