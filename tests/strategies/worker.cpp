// One rank of a strategies test, run N times as real processes by strategies_test.cpp (through
// tests/collectives/ranks.hpp: RANK, WORLD_SIZE, MASTER_PORT of a TCPStore hosted by the test),
// or under the lspawn CLI ("throw"), or once as the caller of DDPSpawn / XLASpawn ("spawn").
//
//   lspawn_strategies_test_worker <scenario> <backend gloo|shm|auto>
//   scenarios: equiv, nosync, bucket_view, calls, checkpoint, throw, spawn
//   env: LSPAWN_TEST_STRATEGY (ddp | ddp_hook | ddp_unused | xla), LSPAWN_TEST_DIR, LSPAWN_TEST_THROW_RANK,
//        LSPAWN_TEST_START (fork | spawn | forkserver | fork-if-allowed), LSPAWN_TEST_NPROCS,
//        LSPAWN_TEST_EXPECT_BACKEND (the Group's backend() the case needs, e.g. hierarchical),
//        LSPAWN_TEST_DIE_RANK (equiv: that rank _exit()s with 7 before its second backward),
//        LSPAWN_TEST_FAILED_BACKWARD=1 (equiv, ddp_hook: the first module's backward throws midway)
// Exit status: 0 all checks passed; 1 a check failed; 5 an exception. Prints "rank R: ..." lines.
#include "tests/strategies/worker.hpp"

#include "collectives/group.hpp"
#include "spawn/threads.hpp"
#include "runtime/error_report.hpp"
#include "strategies/ddp.hpp"
#include "strategies/spawn_strategies.hpp"
#include "strategies/trainer.hpp"
#include "strategies/xla.hpp"
#include "support/env.hpp"
#include "tests/strategies/model.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dirent.h>
#include <unistd.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

using lspawn::test::max_abs_diff;
using lspawn::test::tiny_data;
using lspawn::test::TinyNet;

LSPAWN_REGISTER_SPAWN_FIT(TinyNet);

namespace {

// A module with a parameter its loss never reaches (DDP's find_unused_parameters case).
struct SpareNet : TinyNet {
  explicit SpareNet(uint64_t seed) : TinyNet(seed) { spare = register_module("spare", torch::nn::Linear(8, 8)); }
  torch::nn::Linear spare{nullptr};
};

std::unique_ptr<TinyNet> make_net(const std::string& kind, uint64_t seed) {
  if (kind == "ddp_unused") return std::make_unique<SpareNet>(seed);
  return std::make_unique<TinyNet>(seed);
}

using lspawn::test::env_int;
using lspawn::test::env_str;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("check failed: " + what);
}

std::shared_ptr<lspawn::Group> make_group(const std::string& backend) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env_int("MASTER_PORT", 0));
  so.isServer = false;
  so.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  lspawn::GroupOptions go;
  go.backend = backend == "shm"    ? lspawn::Backend::Shm
               : backend == "auto" ? lspawn::Backend::Auto
                                   : lspawn::Backend::Gloo;
  go.timeout = std::chrono::seconds(60);
  auto g = lspawn::Group::create(store, env_int("RANK", 0), env_int("WORLD_SIZE", 1), go);
  const std::string want = env_str("LSPAWN_TEST_EXPECT_BACKEND");
  check(want.empty() || g->backend() == want, "group backend " + g->backend() + ", wanted " + want);
  return g;
}

// Whether DDP's shm comm hook must be in use: the group has shared memory among its ranks (one
// node: shm+gloo; several nodes: hierarchical).
bool hook_expected(const lspawn::Group& g) { return g.backend() == "shm+gloo" || g.backend() == "hierarchical"; }

std::unique_ptr<lspawn::Strategy> make_strategy(const std::shared_ptr<lspawn::Group>& g, const std::string& kind) {
  lspawn::DDPOptions o;
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  o.first_bucket_cap_bytes = 1024;  // several buckets even for a tiny model
  o.bucket_cap_bytes = 2048;
  if (kind == "xla") return std::make_unique<lspawn::XLA>(g, o);
  o.shm_comm_hook = kind == "ddp_hook";
  o.find_unused_parameters = kind == "ddp_unused";
  return std::make_unique<lspawn::DDP>(g, o);
}

// K steps on this rank's rows of the global batch, compared with one process on the whole batch.
int equiv(const std::string& backend) {
  auto g = make_group(backend);
  const int r = g->rank(), n = g->size();
  const std::string kind = env_str("LSPAWN_TEST_STRATEGY", "ddp");
  const int64_t B = 4, K = 4;
  auto s = make_strategy(g, kind);
  auto owned = make_net(kind, static_cast<uint64_t>(r + 1));  // rank 0's initial weights must win
  TinyNet& net = *owned;
  std::unique_ptr<TinyNet> first;
  if (kind == "ddp_hook") {
    // Set up twice, as the Trainer does when it fits a second module: the first module's reducer
    // and hook thread, which have reduced its buckets, give way to the second's.
    first = make_net(kind, 99);
    s->setup(*first);
    auto data = tiny_data(B * n, 7);
    auto loss = s->training_step({data[0].slice(0, r * B, (r + 1) * B), data[1].slice(0, r * B, (r + 1) * B)}, 0);
    if (env_int("LSPAWN_TEST_FAILED_BACKWARD", 0)) {
      // The first module's backward throws at fc1.weight, its last gradient, after the buckets of
      // fc3 and fc2 went to the hook's thread. Rank 0 sets up the second module at once, with
      // those buckets still queued or being reduced; rank 1 waits 300 ms first, so its hook thread
      // has reduced them all by then. Rank 0's setup() must reduce its own (as rank 1 did) before
      // any collective of the second module, or the two ranks' collectives no longer pair up.
      first->fc1->weight.register_hook([](const at::Tensor&) -> at::Tensor {
        throw std::runtime_error("backward failed on purpose at fc1.weight");
      });
      std::string what;
      try {
        s->backward(loss);
      } catch (const std::exception& e) {
        what = e.what();
      }
      check(what.find("backward failed on purpose") != std::string::npos,
            "the first module's backward throws the hook's error, got '" + what.substr(0, 200) + "'");
      std::printf("rank %d: the first module's backward threw as planned\n", r);
      std::fflush(stdout);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    } else {
      s->backward(loss);
    }
  }
  s->setup(net);
  if (auto* ddp = dynamic_cast<lspawn::DDP*>(s.get())) {
    check(ddp->num_buckets() > 1, "several buckets, got " + std::to_string(ddp->num_buckets()));
    if (kind == "ddp_hook")
      check(ddp->uses_shm_hook() == hook_expected(*g),
            "shm hook in use on shm and hierarchical only (" + g->backend() + ")");
  }
  const int die_rank = env_int("LSPAWN_TEST_DIE_RANK", -1);
  auto opt = net.configure_optimizers();
  for (int64_t k = 0; k < K; ++k) {
    auto data = tiny_data(B * n, 100 + static_cast<uint64_t>(k));
    lspawn::Batch mine = {data[0].slice(0, r * B, (r + 1) * B), data[1].slice(0, r * B, (r + 1) * B)};
    opt->zero_grad();
    auto loss = s->training_step(mine, k);
    if (r == die_rank && k == 1) {
      std::printf("rank %d: dying before backward %lld\n", r, static_cast<long long>(k));
      std::fflush(stdout);
      ::_exit(7);
    }
    s->backward(loss);
    s->optimizer_step(*opt);
  }
  // Every rank holds the same parameters.
  std::vector<at::Tensor> flat;
  for (auto& p : net.parameters()) flat.push_back(p.detach().flatten());
  auto all = s->all_gather(at::cat(flat));
  const double spread = (all - all[0]).abs().max().item<double>();
  check(spread == 0.0, "ranks agree exactly, spread " + std::to_string(spread));
  if (r == 0) {
    auto ref_owned = make_net(kind, 1);
    TinyNet& ref = *ref_owned;
    auto ropt = ref.configure_optimizers();
    for (int64_t k = 0; k < K; ++k) {
      auto data = tiny_data(B * n, 100 + static_cast<uint64_t>(k));
      ropt->zero_grad();
      ref.training_step(data, k).backward();
      ropt->step();
    }
    const double d = max_abs_diff(net, ref);
    std::printf("rank 0: %s %s N=%d max_abs_diff %.3g\n", kind.c_str(), backend.c_str(), n, d);
    check(d <= 1e-5, "max abs diff vs one process " + std::to_string(d));
  }
  s->barrier("end");
  return 0;
}

// Two micro-batches under no_sync + one synchronised = one step on the concatenation.
int nosync(const std::string& backend) {
  auto g = make_group(backend);
  const int r = g->rank(), n = g->size();
  const int64_t B = 3, M = 3, K = 2;
  lspawn::DDPOptions o;
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::DDP s(g, o);
  TinyNet net(1);
  s.setup(net);
  auto opt = net.configure_optimizers();
  for (int64_t k = 0; k < K; ++k) {
    auto data = tiny_data(B * M * n, 200 + static_cast<uint64_t>(k));
    opt->zero_grad();
    for (int64_t m = 0; m < M; ++m) {
      const int64_t lo = (r * M + m) * B;
      lspawn::Batch mb = {data[0].slice(0, lo, lo + B), data[1].slice(0, lo, lo + B)};
      if (m + 1 < M) {
        lspawn::NoSync no_sync(s);
        check(!s.gradient_sync(), "no_sync turns sync off");
        s.backward(s.training_step(mb, m) / static_cast<double>(M));
      } else {
        s.backward(s.training_step(mb, m) / static_cast<double>(M));
      }
    }
    s.optimizer_step(*opt);
  }
  if (r == 0) {
    TinyNet ref(1);
    auto ropt = ref.configure_optimizers();
    for (int64_t k = 0; k < K; ++k) {
      auto data = tiny_data(B * M * n, 200 + static_cast<uint64_t>(k));
      ropt->zero_grad();
      ref.training_step(data, k).backward();
      ropt->step();
    }
    const double d = max_abs_diff(net, ref);
    std::printf("rank 0: no_sync N=%d max_abs_diff %.3g\n", n, d);
    check(d <= 1e-5, "no_sync accumulation vs larger batch " + std::to_string(d));
  }
  s.barrier("end");
  return 0;
}

int calls(const std::string& backend) {
  auto g = make_group(backend);
  const int r = g->rank(), n = g->size();
  lspawn::DDPOptions o;
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::DDP s(g, o);
  s.setup_environment();
  check(s.global_rank() == r && s.world_size() == n, "rank and size");
  check(s.is_global_zero() == (r == 0), "is_global_zero");
  s.barrier("start");
  const auto b = s.broadcast(c10::IValue(std::string("from rank ") + std::to_string(r)), n - 1);
  check(b.toStringRef() == "from rank " + std::to_string(n - 1), "broadcast from last rank: " + b.toStringRef());
  auto gathered = s.all_gather(at::full({2, 3}, static_cast<float>(r)));
  check(gathered.sizes() == at::IntArrayRef({n, 2, 3}), "all_gather shape " + c10::str(gathered.sizes()));
  for (int q = 0; q < n; ++q) check(gathered[q].eq(static_cast<float>(q)).all().item<bool>(), "all_gather row");
  // sync_grads: d/dx_r of sum_q w_q · gather[q] over all ranks' losses = n · w_r.
  auto x = at::full({2}, static_cast<float>(r + 1)).set_requires_grad(true);
  auto w = at::arange(n * 2, at::kFloat).reshape({n, 2});
  (s.all_gather(x, /*sync_grads=*/true) * w).sum().backward();
  check(x.grad().defined() && at::allclose(x.grad(), w[r] * n), "all_gather sync_grads gradient " + c10::str(x.grad()));
  const double mean = s.reduce(at::full({1}, static_cast<double>(r), at::kDouble)).toTensor().item<double>();
  check(mean == (n - 1) / 2.0, "reduce mean " + std::to_string(mean));
  const double sum =
      s.reduce(at::full({1}, static_cast<double>(r), at::kDouble), lspawn::ReduceOp::Sum).toTensor().item<double>();
  check(sum == n * (n - 1) / 2.0, "reduce sum " + std::to_string(sum));
  check(s.reduce(c10::IValue(std::string("text"))).toStringRef() == "text", "reduce passes non-tensors through");
  check(!s.reduce_boolean_decision(r == 0, true), "all=true needs every rank");
  check(s.reduce_boolean_decision(r == 0, false), "all=false needs one rank");
  check(s.reduce_boolean_decision(true, true), "all ranks true");
  s.barrier("end");
  std::printf("rank %d: strategy calls ok on %s\n", r, g->backend().c_str());
  return 0;
}

lspawn::FitResult fit_run(const std::shared_ptr<lspawn::Group>& g, TinyNet& net, lspawn::TrainerOptions t,
                          bool bucket_view = false) {
  lspawn::DDPOptions o;
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  o.gradient_as_bucket_view = bucket_view;
  lspawn::DDP s(g, o);
  t.print_epochs = false;
  t.progress_bar = false;
  lspawn::Trainer trainer(s, t);
  lspawn::DataLoader train(lspawn::TensorDataset(tiny_data(50, 5)),
                           {/*batch_size=*/4, /*shuffle=*/true, /*seed=*/3, false});
  auto r = trainer.fit(net, train);
  s.teardown();
  return r;
}

// The parameters' gradients: the tensors themselves (not copies), in parameter order.
std::vector<at::Tensor> grads_of(TinyNet& net) {
  std::vector<at::Tensor> out;
  for (auto& p : net.parameters()) out.push_back(p.grad());
  return out;
}

// Each gradient is defined and aliases one of `ddp`'s bucket buffers.
void check_bucket_views(lspawn::DDP& ddp, TinyNet& net, const std::string& when) {
  const auto buckets = ddp.bucket_buffers();
  check(!buckets.empty(), "buckets exist " + when);
  std::size_t i = 0;
  for (const auto& g : grads_of(net)) {
    check(g.defined(), "gradient " + std::to_string(i) + " defined " + when);
    bool in_bucket = false;
    for (const auto& b : buckets) in_bucket = in_bucket || g.is_alias_of(b);
    check(in_bucket, "gradient " + std::to_string(i) + " is a view of a bucket " + when);
    ++i;
  }
}

// DDPOptions::gradient_as_bucket_view: K steps through the strategy calls equal the same steps
// with it false and one process on the concatenated batch; after every zero_grad the gradients
// are still the bucket views (same data, zeroed in place), and after the bucket rebuild (second
// step) they stay the same tensors; then through the Trainer (2-batch accumulation under
// no_sync) it equals the Trainer with it false.
int bucket_view(const std::string& backend) {
  auto g = make_group(backend);
  const int r = g->rank(), n = g->size();
  const bool hook = env_str("LSPAWN_TEST_STRATEGY", "ddp") == "ddp_hook";
  const int64_t B = 4, K = 5;
  auto steps = [&](bool as_view, TinyNet& net) {
    lspawn::DDPOptions o;
    o.accelerator = lspawn::AcceleratorKind::Cpu;
    o.first_bucket_cap_bytes = 1024;  // several buckets
    o.bucket_cap_bytes = 2048;
    o.shm_comm_hook = hook;
    o.gradient_as_bucket_view = as_view;
    lspawn::DDP s(g, o);
    s.setup(net);
    check(s.num_buckets() > 1, "several buckets, got " + std::to_string(s.num_buckets()));
    if (hook)
      check(s.uses_shm_hook() == hook_expected(*g),
            "shm hook in use on shm and hierarchical only (" + g->backend() + ")");
    auto opt = net.configure_optimizers();
    std::vector<const void*> rebuilt;  // data pointers of the gradients after the rebuild
    for (int64_t k = 0; k < K; ++k) {
      auto data = tiny_data(B * n, 300 + static_cast<uint64_t>(k));
      lspawn::Batch mine = {data[0].slice(0, r * B, (r + 1) * B), data[1].slice(0, r * B, (r + 1) * B)};
      std::vector<const void*> before;
      if (as_view && k > 0)
        for (const auto& gr : grads_of(net)) before.push_back(gr.data_ptr());
      s.zero_grad(*opt);
      if (as_view && k > 0) {
        const std::string when = "after zero_grad at step " + std::to_string(k);
        check_bucket_views(s, net, when);
        std::size_t i = 0;
        for (const auto& gr : grads_of(net)) {
          check(gr.data_ptr() == before[i], "gradient " + std::to_string(i) + " kept its storage " + when);
          check(gr.eq(0).all().item<bool>(), "gradient " + std::to_string(i) + " zeroed " + when);
          ++i;
        }
      }
      s.backward(s.training_step(mine, k));
      if (as_view) {
        check_bucket_views(s, net, "after backward at step " + std::to_string(k));
        std::vector<const void*> now;
        for (const auto& gr : grads_of(net)) now.push_back(gr.data_ptr());
        if (k == 1) rebuilt = now;
        if (k > 1) check(now == rebuilt, "gradients are the same bucket views at step " + std::to_string(k));
      }
      s.optimizer_step(*opt);
    }
    s.teardown();
  };
  TinyNet viewed(static_cast<uint64_t>(r + 1)), plain(static_cast<uint64_t>(r + 1));
  steps(true, viewed);
  steps(false, plain);
  const double vs_plain = max_abs_diff(viewed, plain);
  check(vs_plain <= 1e-5, "bucket views vs copies into buckets, diff " + std::to_string(vs_plain));
  std::vector<at::Tensor> flat;
  for (auto& p : viewed.parameters()) flat.push_back(p.detach().flatten());
  lspawn::DDPOptions co;
  co.accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::DDP calls(g, co);
  calls.setup_environment();
  auto all = calls.all_gather(at::cat(flat));
  const double spread = (all - all[0]).abs().max().item<double>();
  check(spread == 0.0, "ranks agree exactly, spread " + std::to_string(spread));
  double vs_one = 0;
  if (r == 0) {
    TinyNet ref(1);
    auto ropt = ref.configure_optimizers();
    for (int64_t k = 0; k < K; ++k) {
      auto data = tiny_data(B * n, 300 + static_cast<uint64_t>(k));
      ropt->zero_grad();
      ref.training_step(data, k).backward();
      ropt->step();
    }
    vs_one = max_abs_diff(viewed, ref);
    check(vs_one <= 1e-5, "bucket views vs one process, diff " + std::to_string(vs_one));
  }
  // Through the Trainer: zero_grad, accumulation under no_sync into the views, optimizer steps.
  lspawn::TrainerOptions t;
  t.max_epochs = 2;
  t.accumulate_grad_batches = 2;
  TinyNet fit_viewed(1), fit_plain(1);
  const auto a = fit_run(g, fit_viewed, t, /*bucket_view=*/true);
  const auto b = fit_run(g, fit_plain, t, /*bucket_view=*/false);
  check(a.global_step == b.global_step && a.global_step > 2, "Trainer steps " + std::to_string(a.global_step));
  const double fit_diff = max_abs_diff(fit_viewed, fit_plain);
  check(fit_diff <= 1e-5, "Trainer with bucket views vs without, diff " + std::to_string(fit_diff));
  std::printf("rank %d: bucket_view %s%s N=%d max_abs_diff vs plain %.3g, vs one process %.3g, Trainer %.3g\n", r,
              backend.c_str(), hook ? " hook" : "", n, vs_plain, vs_one, fit_diff);
  calls.barrier("end");
  return 0;
}

int checkpoint(const std::string& backend) {
  auto g = make_group(backend);
  const int r = g->rank();
  const std::string dir = env_str("LSPAWN_TEST_DIR");
  check(!dir.empty(), "LSPAWN_TEST_DIR set");
  TinyNet straight(1);
  lspawn::TrainerOptions t;
  t.max_epochs = 3;
  const auto full = fit_run(g, straight, t);
  TinyNet first(1);
  t.max_epochs = 2;
  t.checkpoint_dir = dir + "/ckpt";
  const auto part = fit_run(g, first, t);
  check(part.last_checkpoint == dir + "/ckpt/last.ckpt", "last checkpoint path " + part.last_checkpoint);
  TinyNet resumed(9);  // other initial weights: everything must come from the checkpoint
  t.max_epochs = 3;
  t.resume_from = part.last_checkpoint;
  const auto rest = fit_run(g, resumed, t);
  check(rest.epochs == 3 && rest.global_step == full.global_step, "resumed epochs/steps");
  const double d = max_abs_diff(straight, resumed);
  std::printf("rank %d: resume max_abs_diff %.3g (steps %lld)\n", r, d, static_cast<long long>(rest.global_step));
  check(d <= 1e-6, "resume reproduces the uninterrupted run, diff " + std::to_string(d));
  // Only global rank 0 writes.
  lspawn::DDPOptions o;
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::DDP s(g, o);
  s.setup_environment();
  s.save_checkpoint(lspawn::Checkpoint::capture(straight, nullptr, 3, 0), dir + "/rank" + std::to_string(r) + ".ckpt");
  s.barrier("saved");
  if (r == 0) {
    struct stat st;
    check(::stat((dir + "/rank0.ckpt").c_str(), &st) == 0, "rank 0 wrote its checkpoint");
    for (int q = 1; q < g->size(); ++q)
      check(::stat((dir + "/rank" + std::to_string(q) + ".ckpt").c_str(), &st) != 0,
            "rank " + std::to_string(q) + " wrote nothing");
    DIR* d = ::opendir((dir + "/ckpt").c_str());
    check(d != nullptr, "checkpoint dir exists");
    while (auto* e = ::readdir(d))
      check(std::string(e->d_name).find(".tmp.") == std::string::npos, "no temp file left");
    ::closedir(d);
  }
  s.barrier("end");
  return 0;
}

// Under the lspawn CLI: DDP with `o` on its own env contract (init_process_group() inside), one
// rank (the env variable `rank_env`, default 1) made to misbehave by `misbehave`, then `epochs`
// of training on the tiny data set.
int fit_under_cli(lspawn::DDPOptions o, const char* rank_env, void (*misbehave)(TinyNet&), int epochs) {
  o.accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::DDP s(o);
  s.setup_environment();
  TinyNet net(1);
  if (s.global_rank() == env_int(rank_env, 1)) misbehave(net);
  lspawn::TrainerOptions t;
  t.max_epochs = epochs;
  t.print_epochs = false;
  lspawn::Trainer trainer(s, t);
  lspawn::DataLoader train(lspawn::TensorDataset(tiny_data(64, 5)), {4, true, 3, false});
  trainer.fit(net, train);
  return 0;
}

// One rank throws in training_step.
int throw_scenario() {
  lspawn::DDPOptions o;
  o.timeout = std::chrono::seconds(30);
  return fit_under_cli(
      o, "LSPAWN_TEST_THROW_RANK", [](TinyNet& net) { net.throw_at = 2; }, 2);
}

// With --hang-timeout: DDP on gloo without the shm hook (the Reducer's all_reduces go to the
// group's c10d process group, runtime/recorded_backend.hpp); one rank stops between two backward
// passes.
int stall_scenario() {
  lspawn::DDPOptions o;
  o.backend = lspawn::Backend::Gloo;
  o.shm_comm_hook = false;
  return fit_under_cli(
      o, "LSPAWN_TEST_STALL_RANK", [](TinyNet& net) { net.stall_at = 2; }, 1);
}

// DDPSpawn / XLASpawn from this process; compared with one process on the concatenated batches.
int spawn_scenario() {
  const std::string kind = env_str("LSPAWN_TEST_STRATEGY", "ddp");
  std::string start = env_str("LSPAWN_TEST_START", "fork");
  const int n = env_int("LSPAWN_TEST_NPROCS", 2);
  const std::string dir = env_str("LSPAWN_TEST_DIR");
  const int64_t B = 4, K = 5;
  lspawn::SpawnStrategyOptions so;
  so.nprocs = n;
  so.ddp.accelerator = lspawn::AcceleratorKind::Cpu;
  so.ddp.backend = lspawn::Backend::Gloo;
  lspawn::TrainerOptions t;
  t.max_epochs = 1;
  t.print_epochs = false;
  t.checkpoint_dir = dir + "/ckpt";
  auto data = tiny_data(n * B * K, 11);
  lspawn::DataLoader train(lspawn::TensorDataset(data), {B, false, 0, false});
  auto net = std::make_shared<TinyNet>(1);
  if (start == "fork-if-allowed") {
    // StartMethod::Fork refuses a process that runs threads, and rightly: on a machine with a
    // GPU this process runs the CUDA driver's (seeding torch's generators or making the first
    // tensor starts it, on the CPU too). Fork where this process allows it, else spawn: decided
    // here, after everything this process does before fit(). The test checks which was chosen.
    const int threads = lspawn::count_threads();
    start = threads == 1 ? "fork" : "spawn";
    std::printf("start method chosen: %s (%d thread%s)\n", start.c_str(), threads, threads == 1 ? "" : "s");
  }
  so.start_method = start == "spawn"        ? lspawn::StartMethod::Spawn
                    : start == "forkserver" ? lspawn::StartMethod::Forkserver
                                            : lspawn::StartMethod::Fork;
  lspawn::SpawnFitResult r;
  if (kind == "xla") {
    lspawn::XLASpawn strategy(so, dir + "/prepared");
    r = strategy.fit(net, train, train, t);
    std::ifstream marker(dir + "/prepared");
    check(marker.good(), "XLASpawn ran the per-node preparation");
  } else {
    lspawn::DDPSpawn strategy(so);
    r = strategy.fit(net, train, train, t);
  }
  check(r.global_step == K, "rank 0 took K steps: " + std::to_string(r.global_step));
  check(r.metrics.count("train_loss") && r.metrics.count("val_acc"), "rank 0's metrics came back");
  check(r.last_checkpoint == dir + "/ckpt/last.ckpt", "rank 0's checkpoint path came back: " + r.last_checkpoint);
  check(r.time_to_first_step > 0, "time to first step measured");
  TinyNet ref(1);
  lspawn::SingleDevice single(lspawn::AcceleratorKind::Cpu);
  lspawn::TrainerOptions rt;
  rt.print_epochs = false;
  lspawn::Trainer trainer(single, rt);
  trainer.fit(ref, lspawn::DataLoader(lspawn::TensorDataset(data), {n * B, false, 0, false}));
  const double d = max_abs_diff(*net, ref);
  std::printf("spawn %s %s N=%d: max_abs_diff %.3g, time to first step %.3f s\n", kind.c_str(), start.c_str(), n, d,
              r.time_to_first_step);
  check(d <= 1e-5,
        "caller holds rank 0's trained weights = one process on the concatenation, diff " + std::to_string(d));
  return 0;
}

}  // namespace

int lspawn::test::strategies_worker_main(int argc, char** argv) {
  lspawn::init(argc, argv);  // a worker started by StartMethod::Spawn runs here and exits
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " <scenario> [backend]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  const std::string backend = argc > 2 ? argv[2] : "gloo";
  // The error report (TORCHELASTIC_ERROR_FILE) lets lspawn name the rank and the exception.
  if (scenario == "throw") return lspawn::record(throw_scenario);
  try {
    if (scenario == "equiv") return equiv(backend);
    if (scenario == "nosync") return nosync(backend);
    if (scenario == "bucket_view") return bucket_view(backend);
    if (scenario == "calls") return calls(backend);
    if (scenario == "checkpoint") return checkpoint(backend);
    if (scenario == "spawn") return spawn_scenario();
    if (scenario == "stall") return stall_scenario();
    std::cerr << "unknown scenario " << scenario << "\n";
    return 2;
  } catch (const std::logic_error& e) {
    std::cerr << "rank " << env_str("RANK", "?") << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "rank " << env_str("RANK", "?") << ": exception: " << e.what() << "\n";
    return 5;
  }
}
