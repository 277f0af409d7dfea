// Test harness: runs N copies of a worker (the collectives' or the strategies' test worker) as
// real processes against a TCPStore server hosted by the test process, and collects their exit
// status and output. A library (lspawn_collectives_test_ranks) both folders link.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace lspawn::test {

// A test worker: its program, and its main() where the test links it too. With `main`, the ranks
// are forked from the test process and run it there (no exec): the test has loaded LibTorch
// already, and a LibTorch program's start (0.5-0.7 s of CPU, most of it the dispatcher's
// registrations and the loader) is most of what a short collectives case costs. Still one real
// process per rank, as after torch.multiprocessing's fork; a test process that has threads (a
// ThreadSanitizer build's own) execs `path` instead, and so does every run with
// LSPAWN_TEST_EXEC_RANKS=1 (to compare, or to rule the fork out).
struct Worker {
  std::string path;
  int (*main)(int argc, char** argv) = nullptr;
};

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
RunResult run_ranks(const Worker& worker, int n, const std::string& scenario, const std::string& backend,
                    const std::map<std::string, std::string>& env = {},
                    std::chrono::seconds deadline = std::chrono::seconds(120));

// Test-case assertion: the run ended in time and every rank exited 0 (its output in the message).
void require_all_ok(const RunResult& r);

}  // namespace lspawn::test
