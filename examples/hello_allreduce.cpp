// hello_allreduce: the smallest lspawn worker. Joins the job from its environment (lspawn or
// torchrun), checks all_reduce / broadcast / all_gather / barrier, and exits 0.
//
//   lspawn --nprocs 4 build/examples/hello_allreduce
//   python3 scripts/torchrun.py --nproc_per_node 2 --no_python build/examples/hello_allreduce
//
// Flags to exercise failure handling (launcher tests, benchmarks); R is a rank, or -1 for none:
//   --size N           elements of the all_reduce tensor (default 4)
//   --iters K          all_reduce repetitions (default 1)
//   --iter-sleep-ms M  sleep M ms after each all_reduce repetition (default 0): K repetitions
//                      then take about K x M ms, so that a fault can land during training;
//                      each rank prints "rank R/N: training: K all_reduce iterations" first
//   --restart-iters K  all_reduce repetitions in a restarted round (TORCHELASTIC_RESTART_COUNT > 0;
//                      default: --iters), so that a first round can train until a fault ends it
//   --delay-ms D       the failure flags below act D ms after initialisation (default 0)
//   --fail-rank R      rank R exits with --exit-code C (default 3) instead of finishing
//   --throw-rank R     rank R throws std::runtime_error (→ error report, exit 1)
//   --signal-rank R    rank R raises --signal S (default SIGSEGV)
//   --hang-rank R      rank R sleeps forever (until the launcher stops it)
//   --no-init          skip the process group: only print the environment (launcher tests)
//   --before-init      the failure flags act before init_process_group(), not after it (a
//                      failure before the rendezvous: lspawn does not restart it, docs/cli.md)
//   --fail-on-attempt A  the failure flags act only on restart attempt A
//                      (TORCHELASTIC_RESTART_COUNT, lspawn --max-restarts); default: every attempt
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <unistd.h>

#include <lspawn/runtime.hpp>

namespace {

struct Flags {
  int64_t size = 4;
  int iters = 1;
  int restart_iters = -1;  // -1: --iters
  int iter_sleep_ms = 0;
  int delay_ms = 0;
  int fail_rank = -1;
  int exit_code = 3;
  int throw_rank = -1;
  int signal_rank = -1;
  int signal = SIGSEGV;
  int hang_rank = -1;
  bool no_init = false;
  int fail_attempt = -1;
  bool before_init = false;
};

long number(const char* flag, const char* value) {
  if (value == nullptr) throw std::invalid_argument(std::string(flag) + " needs a value");
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0') {
    throw std::invalid_argument(std::string(flag) + "='" + value + "' is not an integer");
  }
  return v;
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto take = [&] {
      ++i;
      return number(a.c_str(), v);
    };
    if (a == "--size")
      f.size = take();
    else if (a == "--iters")
      f.iters = static_cast<int>(take());
    else if (a == "--restart-iters")
      f.restart_iters = static_cast<int>(take());
    else if (a == "--iter-sleep-ms")
      f.iter_sleep_ms = static_cast<int>(take());
    else if (a == "--delay-ms")
      f.delay_ms = static_cast<int>(take());
    else if (a == "--fail-rank")
      f.fail_rank = static_cast<int>(take());
    else if (a == "--exit-code")
      f.exit_code = static_cast<int>(take());
    else if (a == "--throw-rank")
      f.throw_rank = static_cast<int>(take());
    else if (a == "--signal-rank")
      f.signal_rank = static_cast<int>(take());
    else if (a == "--signal")
      f.signal = static_cast<int>(take());
    else if (a == "--hang-rank")
      f.hang_rank = static_cast<int>(take());
    else if (a == "--no-init")
      f.no_init = true;
    else if (a == "--before-init")
      f.before_init = true;
    else if (a == "--fail-on-attempt")
      f.fail_attempt = static_cast<int>(take());
    else
      throw std::invalid_argument("unknown flag '" + a + "' (see examples/hello_allreduce.cpp)");
  }
  if (f.size < 1) throw std::invalid_argument("--size must be >= 1");
  if (f.iter_sleep_ms < 0) throw std::invalid_argument("--iter-sleep-ms must be >= 0");
  if (f.restart_iters < -1) throw std::invalid_argument("--restart-iters must be >= 0");
  return f;
}

// This run's restart attempt (TORCHELASTIC_RESTART_COUNT, lspawn --max-restarts): 0 in the first.
int attempt() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return std::atoi(count ? count : "0");
}

// The failure a flag asks of this rank, if any. Returns normally when none.
void maybe_fail(const Flags& f, int rank) {
  if (rank != f.fail_rank && rank != f.throw_rank && rank != f.signal_rank && rank != f.hang_rank) return;
  if (f.fail_attempt >= 0 && attempt() != f.fail_attempt) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_ms));
  std::fflush(stdout);
  if (rank == f.fail_rank) {
    std::fprintf(stderr, "rank %d: failing on purpose with exit code %d\n", rank, f.exit_code);
    std::exit(f.exit_code);  // an example's main, not library code
  }
  if (rank == f.throw_rank) throw std::runtime_error("rank " + std::to_string(rank) + " throws on purpose");
  if (rank == f.signal_rank) std::raise(f.signal);
  if (rank == f.hang_rank) {
    std::fprintf(stderr, "rank %d: hanging on purpose (pid %d)\n", rank, static_cast<int>(::getpid()));
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

int hello(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  if (f.no_init) {
    const auto env = lspawn::WorkerEnv::from_environment();
    std::printf("rank %d/%d: pid %d, master %s:%u\n", env.rank, env.world_size, static_cast<int>(::getpid()),
                env.master_addr.c_str(), env.master_port);
    maybe_fail(f, env.rank);
    return 0;
  }
  if (f.before_init) maybe_fail(f, lspawn::WorkerEnv::from_environment().rank);
  lspawn::World w = lspawn::init_process_group();
  const int r = w.rank(), n = w.size();
  if (!f.before_init) maybe_fail(f, r);

  // all_reduce (sum): every rank contributes rank+1, so each element is N(N+1)/2.
  const double want = n * (n + 1) / 2.0;
  at::Tensor t;
  const int iters = f.restart_iters >= 0 && attempt() > 0 ? f.restart_iters : f.iters;
  if (f.iter_sleep_ms > 0) {
    std::printf("rank %d/%d: training: %d all_reduce iterations\n", r, n, iters);
    std::fflush(stdout);
  }
  for (int i = 0; i < iters; ++i) {
    std::vector<at::Tensor> ts{at::full({f.size}, double(r + 1), at::kFloat)};
    w.pg->allreduce(ts)->wait();
    t = ts[0];
    if (f.iter_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.iter_sleep_ms));
  }
  if (!t.eq(want).all().item<bool>()) {
    std::fprintf(stderr, "rank %d/%d: allreduce sum is wrong: got %g, want %g\n", r, n, t.flatten()[0].item<double>(),
                 want);
    return 2;
  }
  std::printf("rank %d/%d: allreduce sum = %g\n", r, n, t.flatten()[0].item<double>());

  // broadcast from rank 0.
  std::vector<at::Tensor> b{at::full({2}, r == 0 ? 7.0 : 0.0, at::kFloat)};
  w.pg->broadcast(b)->wait();
  if (!b[0].eq(7.0).all().item<bool>()) {
    std::fprintf(stderr, "rank %d/%d: broadcast is wrong: got %g, want 7\n", r, n, b[0][0].item<double>());
    return 2;
  }

  // all_gather: slot i holds rank i.
  std::vector<at::Tensor> in{at::full({1}, double(r), at::kFloat)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < n; ++i) out[0].push_back(at::empty({1}, at::kFloat));
  w.pg->allgather(out, in)->wait();
  for (int i = 0; i < n; ++i) {
    if (out[0][i].item<float>() != float(i)) {
      std::fprintf(stderr, "rank %d/%d: all_gather slot %d is wrong: got %g\n", r, n, i, out[0][i].item<double>());
      return 2;
    }
  }

  w.pg->barrier()->wait();
  if (r == 0)
    std::printf("rank 0/%d: broadcast, all_gather, barrier ok (init %lld ms)\n", n,
                static_cast<long long>(w.init_time.count()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return lspawn::run_main(argc, argv, hello); }
