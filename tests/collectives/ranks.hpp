// Test harness: runs N copies of a worker (the collectives' or the strategies' test worker) as
// real processes against a TCPStore server hosted by the test process (port 0), and collects
// their exit status and output. A library (lspawn_collectives_test_ranks) both folders link.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace lspawn::test {

struct RankResult {
  int exit_code = -1;  // valid when signal == 0
  int signal = 0;      // the signal that killed it, 0 if it exited
  std::string output;  // stdout + stderr
};

struct RunResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;  // the harness had to SIGKILL survivors at its deadline
  double seconds = 0;      // wall time from spawn to the last exit
  std::string all_output() const;
};

// Starts `n` workers `<worker> <scenario> <backend>` (the test's environment, with
// RANK/WORLD_SIZE/MASTER_PORT and `env`; output in files of a temp dir),
// waits up to `deadline` for all of them (then SIGKILLs the rest), returns what they did.
// env LSPAWN_TEST_NODES="0,0,1,1" fakes nodes: rank r gets LSPAWN_NODE_ID and the env contract's
// GROUP_RANK / LOCAL_RANK / LOCAL_WORLD_SIZE / GROUP_WORLD_SIZE of node nodes[r] (all on loopback).
RunResult run_ranks(const std::string& worker, int n, const std::string& scenario, const std::string& backend,
                    const std::map<std::string, std::string>& env = {},
                    std::chrono::seconds deadline = std::chrono::seconds(120));

// Test-case assertion: the run ended in time and every rank exited 0 (its output in the message).
void require_all_ok(const RunResult& r);

}  // namespace lspawn::test
