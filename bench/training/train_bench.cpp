// Training throughput of lspawn's DDP (c10d::Reducer on a gloo or shm Group), the model of the
// Python reference: MLP 784-1024-1024-10, batch 64 per rank, fp32, SGD, synthetic data.
//
//   lspawn --nprocs N build/bench/training/train_bench [--steps S] [--warmup W] [--hook] [--backend gloo|shm|auto]
//                                                      [--bucket-view]   (DDPOptions::gradient_as_bucket_view)
//   build/bench/training/train_bench --spawn N [--start fork|spawn|forkserver]   # DDPSpawn: fit() → first step
//
// Prints one JSON line from rank 0: steps/s per rank; the compute-only step time (same steps,
// every backward under no_sync); a bare all-reduce of all gradients (1.86M floats, through the
// same path as DDP's buckets); and the share of that all-reduce hidden behind backward:
//   hidden = 1 − (t_ddp − t_compute) / t_allreduce.
#include <lspawn/collectives.hpp>
#include <lspawn/spawn.hpp>
#include <lspawn/strategies.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <chrono>
#include <optional>
#include <cstdio>
#include <string>

namespace {

struct Mlp : lspawn::TrainingModule {
  Mlp() {
    at::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(784, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, 1024));
    fc3 = register_module("fc3", torch::nn::Linear(1024, 10));
  }
  at::Tensor training_step(const lspawn::Batch& b, int64_t) override {
    return at::nll_loss(at::log_softmax(fc3(at::relu(fc2(at::relu(fc1(b[0]))))), 1), b[1]);
  }
  std::shared_ptr<torch::optim::Optimizer> configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
LSPAWN_REGISTER_SPAWN_FIT(Mlp);

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  lspawn::init(argc, argv);
  int steps = 200, warmup = 20, spawn = 0;
  bool hook = false, bucket_view = false;
  std::string backend = "gloo", start = "fork";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps")
      steps = std::stoi(argv[++i]);
    else if (a == "--warmup")
      warmup = std::stoi(argv[++i]);
    else if (a == "--hook")
      hook = true;
    else if (a == "--bucket-view")
      bucket_view = true;
    else if (a == "--backend")
      backend = argv[++i];
    else if (a == "--spawn")
      spawn = std::stoi(argv[++i]);
    else if (a == "--start")
      start = argv[++i];
    else {
      std::fprintf(stderr, "train_bench: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (backend != "gloo" && backend != "shm" && backend != "auto") {
    std::fprintf(stderr, "train_bench: --backend: '%s' is not gloo, shm or auto\n", backend.c_str());
    return 2;
  }
  if (spawn > 0) {
    const double t0 = now();
    auto net = std::make_shared<Mlp>();
    lspawn::SpawnStrategyOptions so;
    so.nprocs = spawn;
    so.start_method = start == "spawn"        ? lspawn::StartMethod::Spawn
                      : start == "forkserver" ? lspawn::StartMethod::Forkserver
                                              : lspawn::StartMethod::Fork;
    so.ddp.accelerator = lspawn::AcceleratorKind::Cpu;
    lspawn::TrainerOptions t;
    t.print_epochs = false;
    auto x = at::randn({64 * spawn * 2, 784});
    auto y = at::randint(0, 10, {64 * spawn * 2}, at::kLong);
    lspawn::DataLoader data(lspawn::TensorDataset({x, y}), {64, false, 0, false});
    lspawn::DDPSpawn strategy(so);
    const auto r = strategy.fit(net, data, std::nullopt, t);
    std::printf(
        "{\"impl\": \"lspawn-ddpspawn\", \"start\": \"%s\", \"nprocs\": %d, \"fit_to_first_step_s\": %.3f, "
        "\"total_s\": %.3f}\n",
        start.c_str(), spawn, r.time_to_first_step, now() - t0);
    return 0;
  }

  lspawn::DDPOptions o;
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  // auto: shm on one node, hierarchical across nodes (bench/multinode/ddp.sh).
  o.backend = backend == "shm"    ? lspawn::Backend::Shm
              : backend == "auto" ? lspawn::Backend::Auto
                                  : lspawn::Backend::Gloo;
  o.shm_comm_hook = hook;
  o.gradient_as_bucket_view = bucket_view;
  lspawn::DDP ddp(o);
  Mlp net;
  ddp.setup(net);
  auto opt = net.configure_optimizers();
  at::manual_seed(1 + ddp.global_rank());
  lspawn::Batch batch = {at::randn({64, 784}), at::randint(0, 10, {64}, at::kLong)};
  // Per phase of the synchronised steps (rank 0's view): forward (training_step), backward
  // (with DDP: until every bucket is reduced), optimizer step; zero_grad counts as forward.
  double t_fwd = 0, t_bwd = 0, t_opt = 0;
  auto run = [&](int n, bool sync) {
    ddp.barrier("phase");
    t_fwd = t_bwd = t_opt = 0;
    const double t0 = now();
    for (int i = 0; i < n; ++i) {
      const double a = now();
      ddp.zero_grad(*opt);
      at::Tensor loss;
      {
        std::optional<lspawn::NoSync> no_sync;
        if (!sync) no_sync.emplace(ddp);
        loss = ddp.training_step(batch, i);
        const double b = now();
        ddp.backward(loss);
        t_fwd += b - a;
        t_bwd += now() - b;
      }
      const double c = now();
      ddp.optimizer_step(*opt);
      t_opt += now() - c;
    }
    t_fwd /= n, t_bwd /= n, t_opt /= n;
    return (now() - t0) / n;
  };
  run(warmup, true);
  const double t_ddp = run(steps, true);
  const double f_sync = t_fwd, b_sync = t_bwd, o_sync = t_opt;
  const double t_compute = run(steps / 2, false);
  const double b_compute = t_bwd;
  // The same gradients, reduced alone: one flat buffer through the path DDP's buckets take.
  std::vector<at::Tensor> grads;
  for (auto& p : net.parameters()) grads.push_back(at::zeros_like(p));
  int64_t floats = 0;
  for (auto& g : grads) floats += g.numel();
  std::vector<at::Tensor> bucket{at::zeros({floats})};  // one flat buffer, as a bucket
  ddp.barrier("allreduce");
  const int reps = std::max(10, steps / 4);
  const double a0 = now();
  for (int i = 0; i < reps; ++i) {
    if (hook) {
      lspawn::all_reduce_coalesced(ddp.group(), grads, lspawn::ReduceOp::Sum);
    } else {
      ddp.group().process_group()->allreduce(bucket)->wait();
    }
  }
  const double t_ar = (now() - a0) / reps;
  const double hidden = ddp.world_size() > 1 ? 1.0 - (t_ddp - t_compute) / t_ar : 0.0;
  if (ddp.is_global_zero()) {
    std::printf(
        "{\"impl\": \"lspawn-ddp\", \"path\": \"%s\", \"world\": %d, \"steps_per_s\": %.2f, \"step_ms\": %.2f, "
        "\"compute_ms\": %.2f, \"allreduce_ms\": %.2f, \"grad_floats\": %lld, \"buckets\": %zu, "
        "\"hidden\": %.2f, \"fwd_ms\": %.2f, \"bwd_ms\": %.2f, \"bwd_nosync_ms\": %.2f, \"opt_ms\": %.2f, "
        "\"intra_op_threads\": %d, \"bucket_view\": %s}\n",
        hook ? (!ddp.uses_shm_hook()                      ? "hook-unavailable"
                : ddp.group().backend() == "hierarchical" ? "hierarchical-hook"
                                                          : "shm-hook")
             : "gloo",
        ddp.world_size(), 1.0 / t_ddp, t_ddp * 1e3, t_compute * 1e3, t_ar * 1e3, static_cast<long long>(floats),
        ddp.num_buckets(), hidden, f_sync * 1e3, b_sync * 1e3, b_compute * 1e3, o_sync * 1e3, at::get_num_threads(),
        o.gradient_as_bucket_view ? "true" : "false");
  }
  ddp.barrier("end");
  return 0;
}
