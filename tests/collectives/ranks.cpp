#include "ranks.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

extern char** environ;

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
    throw std::invalid_argument("LSPAWN_TEST_NODES='" + spec + "' must list one node per rank (" + std::to_string(n) + ")");
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

RunResult run_ranks(int n, const std::string& scenario, const std::string& backend,
                    const std::map<std::string, std::string>& env, std::chrono::seconds deadline) {
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);

  char dir_template[] = "/tmp/lspawn-collectives-test-XXXXXX";
  if (!::mkdtemp(dir_template)) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  const std::string dir = dir_template;

  std::vector<pid_t> pids(n, -1);
  std::vector<std::string> logs(n);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const auto eq = kv.find('=');
      if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : env) vars[k] = v;
    if (const auto it = env.find("LSPAWN_TEST_NODES"); it != env.end()) fake_node(vars, it->second, r, n);
    vars["RANK"] = std::to_string(r);
    vars["WORLD_SIZE"] = std::to_string(n);
    vars["MASTER_ADDR"] = "127.0.0.1";
    vars["MASTER_PORT"] = std::to_string(store->getPort());
    vars["OMP_NUM_THREADS"] = "1";
    std::vector<std::string> kvs;
    for (const auto& [k, v] : vars) kvs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : kvs) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string worker = LSPAWN_COLLECTIVES_TEST_WORKER;
    std::vector<std::string> args = {worker, scenario, backend};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    logs[r] = dir + "/rank" + std::to_string(r) + ".log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, worker.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL), ::waitpid(p, nullptr, 0);
      throw std::runtime_error("posix_spawn " + worker + ": " + std::strerror(rc));
    }
    pids[r] = pid;
  }

  RunResult result;
  result.ranks.resize(n);
  int alive = n;
  const auto end = start + deadline;
  while (alive > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        if (WIFEXITED(status)) result.ranks[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) result.ranks[r].signal = WTERMSIG(status);
        pids[r] = -1;
        --alive;
      }
    }
    if (alive == 0) break;
    if (std::chrono::steady_clock::now() > end) {
      result.timed_out = true;
      for (int r = 0; r < n; ++r)
        if (pids[r] > 0) ::kill(pids[r], SIGKILL);
      for (int r = 0; r < n; ++r)
        if (pids[r] > 0) {
          int status = 0;
          ::waitpid(pids[r], &status, 0);
          result.ranks[r].signal = SIGKILL;
          pids[r] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < n; ++r) {
    std::ifstream in(logs[r]);
    std::stringstream ss;
    ss << in.rdbuf();
    result.ranks[r].output = ss.str();
    ::unlink(logs[r].c_str());
  }
  ::rmdir(dir.c_str());
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
