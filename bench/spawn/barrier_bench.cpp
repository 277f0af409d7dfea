// spawn() with StartMethod::Fork (or another, --method), N ranks, each forming a gloo process
// group (lspawn::init_process_group) and running a barrier. Reports, per run, the time from
// the spawn() call to the last rank past the barrier (each rank returns its CLOCK_MONOTONIC
// time after the barrier), and the time until spawn() returned (workers reaped).
//
// Usage: spawn_barrier_bench [--nprocs 8] [--runs 10] [--method fork|spawn|forkserver]
// Output: one line per run, then "median_ms_to_barrier=<x> median_ms_total=<y>".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <lspawn/runtime.hpp>
#include <lspawn/spawn.hpp>

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Returns {entered fn, process group ready, past the barrier} (CLOCK_MONOTONIC ns).
std::vector<int64_t> barrier_rank(int) {
  const int64_t entered = now_ns();
  lspawn::World world = lspawn::init_process_group();
  const int64_t ready = now_ns();
  world.pg->barrier()->wait();
  return {entered, ready, now_ns()};
}
LSPAWN_REGISTER(barrier_rank);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  lspawn::StartupOptions startup;
  startup.start_forkserver = true;
  lspawn::init(argc, argv, startup);
  int nprocs = 8, runs = 10;
  lspawn::StartMethod method = lspawn::StartMethod::Fork;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--nprocs") {
      nprocs = std::atoi(value.c_str());
    } else if (flag == "--runs") {
      runs = std::atoi(value.c_str());
    } else if (flag == "--method") {
      method = value == "spawn"        ? lspawn::StartMethod::Spawn
               : value == "forkserver" ? lspawn::StartMethod::Forkserver
                                       : lspawn::StartMethod::Fork;
    } else {
      std::fprintf(stderr, "usage: %s [--nprocs N] [--runs R] [--method fork|spawn|forkserver]\n", argv[0]);
      return 2;
    }
  }
  lspawn::SpawnOptions o;
  o.nprocs = nprocs;
  o.start_method = method;
  o.on_info = [](const std::string&) {};
  std::vector<double> to_barrier, total, to_started, to_group;
  for (int r = 0; r < runs; ++r) {
    const int64_t t0 = now_ns();
    auto ctx = lspawn::spawn(barrier_rank, o);
    const int64_t t1 = now_ns();
    int64_t started = 0, grouped = 0, last = 0;
    for (const auto& v : ctx.results<std::vector<int64_t>>()) {
      started = std::max(started, v->at(0));
      grouped = std::max(grouped, v->at(1));
      last = std::max(last, v->at(2));
    }
    to_started.push_back((started - t0) / 1e6);
    to_group.push_back((grouped - t0) / 1e6);
    to_barrier.push_back((last - t0) / 1e6);
    total.push_back((t1 - t0) / 1e6);
    std::printf(
        "run %d: all ranks running after %.1f ms, process group ready %.1f ms, past the "
        "barrier %.1f ms; spawn() returned after %.1f ms\n",
        r, to_started.back(), to_group.back(), to_barrier.back(), total.back());
  }
  std::printf(
      "lspawn.spawn method=%s nprocs=%d runs=%d median_ms_to_barrier=%.1f "
      "median_ms_total=%.1f median_ms_to_running=%.1f median_ms_to_group=%.1f\n",
      lspawn::start_method_name(method), nprocs, runs, median(to_barrier), median(total), median(to_started),
      median(to_group));
  return 0;
}
