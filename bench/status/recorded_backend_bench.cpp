// lspawn_bench_recorded_backend: what recording one op of a c10d backend costs the issuing thread
// (runtime/recorded_backend.hpp), beside the op itself.
//
//   lspawn_bench_recorded_backend [ITERATIONS]
//
// BackendRecord::run() around a start() that returns an already completed Work (a future marked
// complete): the sequence number, the slot's enter (compare-and-swap), the callback added to the
// future (run at once, since it is complete: the slot's complete), and the RecordingPause. Against
// the same loop with the record not started (one atomic load), and with the status record off.
// Thread CPU time, best of 5, as recorder_bench.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <time.h>
#include <unistd.h>

#include <ATen/core/ivalue.h>

#include "bench/status/cpu_time.hpp"
#include "runtime/recorded_backend.hpp"

namespace {

// A Work that is complete, with a completed future: what a finished gloo op hands back.
class DoneWork : public c10d::Work {
 public:
  DoneWork() : future_(c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get())) {
    future_->markCompleted(c10::IValue());
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  bool isCompleted() override { return true; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

double ns_per_op(lspawn::BackendRecord& record, const c10::intrusive_ptr<c10d::Work>& work, long n) {
  return lspawn::bench::best_cpu_ns_per(n, [&](long) { (void)record.run("all_reduce", 16, [&] { return work; }); });
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 2'000'000;
  char dir[] = "/tmp/lspawn-recorded-backend-bench-XXXXXX";
  if (!::mkdtemp(dir)) return 1;
  ::setenv("LSPAWN_STATUS_DIR", dir, 1);
  ::setenv("RANK", "0", 1);
  const c10::intrusive_ptr<c10d::Work> work = c10::make_intrusive<DoneWork>();
  lspawn::BackendRecord recording;
  recording.open("world.pg", 0, 2);
  recording.start();
  lspawn::BackendRecord not_started;
  not_started.open("world.pg.idle", 0, 2);
  const double on = ns_per_op(recording, work, n);
  const double off = ns_per_op(not_started, work, n);
  std::printf(
      "c10d backend op, recording: %.1f ns (enter, future callback, complete), not recording: %.1f ns "
      "(%ld ops, best of 5)\n",
      on, off, n);
  ::unlink((std::string(dir) + "/rank-0.status").c_str());
  ::rmdir(dir);
  return 0;
}
