// Waits for what a test cannot get an event for (a file another process writes, a log line, a
// process gone): polls every 5 ms up to a limit. Each says whether the condition held; the test
// asserts on it (REQUIRE(wait_file(p, 30s))), so its failure names what did not happen. Tests only.
#pragma once

#include <chrono>
#include <string>
#include <thread>

namespace lspawn::test {

// Polls `pred` until it holds or `limit` passes; returns pred() (asked once more at the end, so a
// condition met on the deadline counts).
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// Whether something is at `path` within `limit`.
bool wait_file(const std::string& path, std::chrono::milliseconds limit);

// Whether the files <prefix>0 .. <prefix><n-1> all exist within `limit` (all together, not each).
bool wait_files(const std::string& prefix, int n, std::chrono::milliseconds limit);

}  // namespace lspawn::test
