// lspawn_bench_status_recorder: what recording a collective costs (docs/hang-diagnosis.md).
//
//   lspawn_bench_status_recorder [ITERATIONS]
//
// Times ITERATIONS (default 10M) pairs of SlotWriter::enter + complete, the two calls every
// collective makes, on an enabled slot (a record in a temp dir) and on a disabled one (a worker
// outside lspawn), and prints ns per pair for each, best of 5 runs. Timed in this thread's CPU
// time (CLOCK_THREAD_CPUTIME_ID), so that a shared, loaded machine's time slicing is not counted.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <time.h>
#include <unistd.h>

#include "bench/status/cpu_time.hpp"
#include "status/recorder.hpp"

namespace {

double ns_per_pair(lspawn::status::SlotWriter slot, long n) {
  return lspawn::bench::best_cpu_ns_per(n, [&](long i) {
    slot.enter("all_reduce", static_cast<std::uint64_t>(i), 4);
    slot.complete(static_cast<std::uint64_t>(i));
  });
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 10'000'000;
  char dir[] = "/tmp/lspawn-recorder-bench-XXXXXX";
  if (!::mkdtemp(dir)) return 1;
  auto rec = lspawn::status::Recorder::create(dir, 0);
  const double on = ns_per_pair(rec->add_group("world", 0, 2), n);
  const double many = ns_per_pair(rec->add_group("world.pg", 0, 2, lspawn::status::Writers::Many), n);
  const double off = ns_per_pair(lspawn::status::SlotWriter(), n);
  std::printf(
      "enter+complete per collective: %.1f ns recording, %.1f ns recording a c10d backend's slot "
      "(Writers::Many: compare-and-swap), %.1f ns disabled (%ld pairs, best of 5)\n",
      on, many, off, n);
  ::unlink((std::string(dir) + "/rank-0.status").c_str());
  ::rmdir(dir);
  return 0;
}
