// The bench/status programs' one timing rule: this thread's CPU time (CLOCK_THREAD_CPUTIME_ID, so
// that a shared, loaded machine's time slicing is not counted) per call of `step(i)`, i = 1..n,
// the best of 5 runs.
#pragma once

#include <algorithm>

#include <time.h>

namespace lspawn::bench {

inline double thread_cpu_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

template <typename Step>
double best_cpu_ns_per(long n, Step&& step) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const double t0 = thread_cpu_ns();
    for (long i = 1; i <= n; ++i) step(i);
    best = std::min(best, (thread_cpu_ns() - t0) / n);
  }
  return best;
}

}  // namespace lspawn::bench
