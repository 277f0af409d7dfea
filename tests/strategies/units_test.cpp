// In-process tests of the strategies' pieces that need no peers: DistributedSampler arithmetic,
// DataLoader, checkpoint files, precision plugin, ParallelLoader, SingleDevice / DataParallel
// through the Trainer, DataParallel over several CPU replicas.
#include "strategies/checkpoint.hpp"
#include "strategies/data.hpp"
#include "strategies/data_parallel.hpp"
#include "strategies/parallel.hpp"
#include "strategies/precision.hpp"
#include "strategies/spawn_strategies.hpp"
#include "strategies/trainer.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"
#include "runtime/torch_compat.hpp"
#include "collectives/error.hpp"
#include "proto/error.hpp"
#include "runtime/process_group.hpp"
#include "runtime/rendezvous_outcome.hpp"
#include "runtime/worker_env.hpp"
#include "tests/strategies/model.hpp"

#include <algorithm>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

// lspawn::Error (proto/error.hpp) is the base of the LibTorch-linked parts' exceptions too (the
// torch-free ones: tests/launcher/error_base_test.cpp).
static_assert(std::is_base_of_v<lspawn::Error, lspawn::EnvError> &&
              std::is_base_of_v<lspawn::Error, lspawn::RendezvousError> &&
              std::is_base_of_v<lspawn::Error, lspawn::ProcessGroupError> &&
              std::is_base_of_v<lspawn::Error, lspawn::CollectiveError> &&
              std::is_base_of_v<lspawn::Error, lspawn::ReplicaError> &&
              std::is_base_of_v<lspawn::Error, lspawn::CheckpointError>);

using lspawn::DistributedSampler;

TEST_CASE("DistributedSampler: torch's padding, drop_last and per-rank interleaving", "[unit][strategies][data]") {
  DistributedSampler s;
  s.dataset_size = 10;
  s.num_replicas = 4;
  s.shuffle = false;
  CHECK(s.num_samples() == 3);  // ceil(10/4), padded to 12
  std::vector<std::vector<int64_t>> got;
  for (int r = 0; r < 4; ++r) {
    s.rank = r;
    got.push_back(s.indices());
  }
  CHECK(got[0] == std::vector<int64_t>{0, 4, 8});
  CHECK(got[1] == std::vector<int64_t>{1, 5, 9});
  CHECK(got[2] == std::vector<int64_t>{2, 6, 0});  // padding repeats the head
  CHECK(got[3] == std::vector<int64_t>{3, 7, 1});
  s.drop_last = true;
  CHECK(s.num_samples() == 2);  // ceil((10-4)/4)
  s.rank = 3;
  CHECK(s.indices() == std::vector<int64_t>{3, 7});
  s.rank = 4;
  CHECK_THROWS_AS(s.indices(), std::invalid_argument);
}

TEST_CASE("DistributedSampler: shuffle shared by ranks, new order per epoch, shards disjoint",
          "[unit][strategies][data]") {
  DistributedSampler s;
  s.dataset_size = 20;
  s.num_replicas = 2;
  s.seed = 7;
  std::set<int64_t> all;
  std::vector<int64_t> r0;
  for (int r = 0; r < 2; ++r) {
    s.rank = r;
    auto idx = s.indices();
    if (r == 0) r0 = idx;
    all.insert(idx.begin(), idx.end());
  }
  CHECK(all.size() == 20);
  s.rank = 0;
  CHECK(s.indices() == r0);  // deterministic in seed + epoch
  s.set_epoch(1);
  CHECK(s.indices() != r0);
}

TEST_CASE("DataLoader: batches, drop_last, distributed shard", "[unit][strategies][data]") {
  auto data = lspawn::test::tiny_data(10, 1);
  lspawn::DataLoader l(lspawn::TensorDataset(data), {4, false, 0, false});
  CHECK(l.size() == 3);
  CHECK(l.batch(2)[0].size(0) == 2);
  CHECK(at::equal(l.batch(0)[0], data[0].slice(0, 0, 4)));
  CHECK_THROWS_AS(l.batch(3), std::out_of_range);
  lspawn::DataLoader d(lspawn::TensorDataset(data), {4, false, 0, true});
  CHECK(d.size() == 2);
  auto shard = l.distributed(1, 2);
  CHECK(shard.num_samples() == 5);
  CHECK(at::equal(shard.batch(0)[1], data[1].index_select(0, at::tensor({1, 3, 5, 7}, at::kLong))));
  CHECK_THROWS_AS(lspawn::TensorDataset({at::zeros({3}), at::zeros({4})}), std::invalid_argument);
}

TEST_CASE("ParallelLoader prefetches the loader's batches in order and rethrows errors", "[unit][strategies][data]") {
  auto data = lspawn::test::tiny_data(10, 1);
  lspawn::DataLoader l(lspawn::TensorDataset(data), {3, true, 5, false});
  lspawn::ParallelLoader p(l, at::kCPU, 2);
  CHECK(p.size() == 4);
  for (int64_t i = 0; i < 4; ++i) {
    auto b = p.next();
    REQUIRE(b.has_value());
    CHECK(at::equal((*b)[0], l.batch(i)[0]));
  }
  CHECK_FALSE(p.next().has_value());
}

TEST_CASE("checkpoint files: round trip, atomic replace, clear errors", "[unit][strategies][checkpoint]") {
  lspawn::test::TempDir dir;
  lspawn::test::TinyNet a(1), b(2);
  auto opt = a.configure_optimizers();
  a.training_step(lspawn::test::tiny_data(8, 3), 0).backward();
  opt->step();
  auto ck = lspawn::Checkpoint::capture(a, opt.get(), 4, 17);
  ck.metrics["val_acc"] = 0.5;
  const std::string path = dir.file("x.ckpt");
  lspawn::write_checkpoint_file(ck, path);
  lspawn::write_checkpoint_file(ck, path);  // replaced, not appended or torn
  auto back = lspawn::read_checkpoint_file(path);
  CHECK(back.epoch == 4);
  CHECK(back.global_step == 17);
  CHECK(back.metrics.at("val_acc") == 0.5);
  auto opt_b = b.configure_optimizers();
  back.restore(b, opt_b.get());
  CHECK(lspawn::test::max_abs_diff(a, b) == 0.0);
  CHECK(lspawn::test::read_file(path).size() > 0);
  CHECK_THROWS_AS(lspawn::read_checkpoint_file(dir.file("missing")), lspawn::CheckpointError);
  {
    std::FILE* f = std::fopen(dir.file("garbage").c_str(), "w");
    std::fputs("not a checkpoint", f);
    std::fclose(f);
  }
  CHECK_THROWS_AS(lspawn::read_checkpoint_file(dir.file("garbage")), lspawn::CheckpointError);
  CHECK_THROWS_AS(lspawn::write_checkpoint_file(ck, dir.file("no/such/dir/x.ckpt")), lspawn::CheckpointError);
}

TEST_CASE("precision: bf16-mixed autocasts on CPU inside the scope only - 16-mixed refuses CPU",
          "[unit][strategies][precision]") {
  lspawn::PrecisionPlugin bf16(lspawn::Precision::Bf16Mixed, at::kCPU);
  auto x = at::randn({4, 8});
  auto w = at::randn({8, 3});
  {
    auto scope = bf16.forward_context();
    CHECK(at::mm(x, w).scalar_type() == at::kBFloat16);
  }
  CHECK(at::mm(x, w).scalar_type() == at::kFloat);
  lspawn::PrecisionPlugin f32(lspawn::Precision::F32True, at::kCPU);
  {
    auto scope = f32.forward_context();
    CHECK(at::mm(x, w).scalar_type() == at::kFloat);
  }
  CHECK_THROWS_WITH(lspawn::PrecisionPlugin(lspawn::Precision::F16Mixed, at::kCPU),
                    Catch::Matchers::Contains("16-mixed") && Catch::Matchers::Contains("CUDA"));
  CHECK(lspawn::parse_precision("bf16-mixed") == lspawn::Precision::Bf16Mixed);
  CHECK_THROWS_AS(lspawn::parse_precision("8-bit"), std::invalid_argument);
}

TEST_CASE(
    "SingleDevice / DataParallel (one device, two CPU replicas) through the Trainer: fit, validate, test, predict",
    "[unit][strategies][trainer]") {
  auto data = lspawn::test::tiny_data(256, 4);
  lspawn::DataLoader train(lspawn::TensorDataset(data), {16, true, 1, false});
  for (int dp = 0; dp < 3; ++dp) {
    lspawn::test::TinyNet net(1);
    std::unique_ptr<lspawn::Strategy> s;
    if (dp == 1)
      s = std::make_unique<lspawn::DataParallel>();
    else if (dp == 2)
      s = std::make_unique<lspawn::DataParallel>(std::vector<c10::Device>{c10::kCPU, c10::kCPU});
    else
      s = std::make_unique<lspawn::SingleDevice>(lspawn::AcceleratorKind::Cpu, lspawn::Precision::Bf16Mixed);
    lspawn::TrainerOptions o;
    o.max_epochs = 8;
    o.print_epochs = false;
    lspawn::Trainer t(*s, o);
    auto before = t.validate(net, train);
    auto r = t.fit(net, train, train);
    CHECK(r.epochs == 8);
    CHECK(r.global_step == 8 * 16);
    auto after = t.test(net, train);
    CHECK(after.at("test_acc") > before.at("val_acc"));
    CHECK(after.at("test_acc") > 0.8);
    CHECK(t.predict(net, train).size(0) == 256);
  }
}

TEST_CASE("Trainer: accumulate_grad_batches steps once per group", "[unit][strategies][trainer]") {
  lspawn::test::TinyNet net(1);
  lspawn::SingleDevice s(lspawn::AcceleratorKind::Cpu);
  lspawn::TrainerOptions o;
  o.accumulate_grad_batches = 3;
  o.print_epochs = false;
  lspawn::Trainer t(s, o);
  auto r = t.fit(net, lspawn::DataLoader(lspawn::TensorDataset(lspawn::test::tiny_data(40, 2)), {4, false, 0, false}));
  CHECK(r.global_step == 4);  // 10 batches: steps after 3, 6, 9 and the last
}

TEST_CASE("Trainer: an exception in training_step propagates after on_exception", "[unit][strategies][trainer]") {
  lspawn::test::TinyNet net(1);
  net.throw_at = 1;
  lspawn::SingleDevice s(lspawn::AcceleratorKind::Cpu);
  lspawn::Trainer t(s, {});
  CHECK_THROWS_WITH(
      t.fit(net, lspawn::DataLoader(lspawn::TensorDataset(lspawn::test::tiny_data(8, 2)), {2, false, 0, false})),
      Catch::Matchers::Contains("failed on purpose at batch 1"));
}

TEST_CASE("DDPSpawn with nprocs = 1 trains in the caller on one device", "[unit][strategies][spawn]") {
  if (std::getenv("WORLD_SIZE")) {
    WARN("WORLD_SIZE is set in this environment: the single-process path is not taken; skipped");
    return;
  }
  auto net = std::make_shared<lspawn::test::TinyNet>(1);
  lspawn::test::TinyNet ref(1);
  lspawn::SpawnStrategyOptions so;
  so.nprocs = 1;
  so.ddp.accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::TrainerOptions t;
  t.print_epochs = false;
  lspawn::DataLoader data(lspawn::TensorDataset(lspawn::test::tiny_data(32, 6)), {8, false, 0, false});
  auto r = lspawn::DDPSpawn(so).fit(net, data, std::nullopt, t);
  CHECK(r.global_step == 4);
  lspawn::SingleDevice s(lspawn::AcceleratorKind::Cpu);
  lspawn::Trainer(s, t).fit(ref, data);
  CHECK(lspawn::test::max_abs_diff(*net, ref) == 0.0);
}

namespace {

// TinyNet whose steps record, per call, the rows they got, their thread, grad mode and CPU
// autocast (shared by the module and its replicas); throws when given `throw_on_rows` rows.
struct LoggedNet : lspawn::test::TinyNet {
  struct Call {
    int64_t rows;
    std::thread::id thread;
    bool grad;
    bool autocast;
  };
  struct Log {
    std::mutex mu;
    std::vector<Call> calls;
  };
  explicit LoggedNet(uint64_t seed = 1, std::shared_ptr<Log> l = std::make_shared<Log>())
      : TinyNet(seed), log(std::move(l)) {}
  void record(const lspawn::Batch& b) {
    if (b[0].size(0) == throw_on_rows) throw std::runtime_error("replica step failed on purpose");
    std::lock_guard<std::mutex> lock(log->mu);
    log->calls.push_back({b[0].size(0), std::this_thread::get_id(), at::GradMode::is_enabled(),
                          lspawn::compat::autocast_enabled(at::kCPU)});
  }
  at::Tensor training_step(const lspawn::Batch& b, int64_t idx) override {
    record(b);
    return TinyNet::training_step(b, idx);
  }
  lspawn::StepMetrics validation_step(const lspawn::Batch& b, int64_t idx) override {
    record(b);
    return TinyNet::validation_step(b, idx);
  }
  std::shared_ptr<lspawn::TrainingModule> make_replica() const override {
    auto r = std::make_shared<LoggedNet>(99, log);  // other weights: the strategy must copy the root's
    r->lr = lr;
    r->throw_on_rows = throw_on_rows;
    return r;
  }
  std::vector<Call> take() {
    std::lock_guard<std::mutex> lock(log->mu);
    return std::exchange(log->calls, {});
  }
  std::shared_ptr<Log> log;
  int64_t throw_on_rows = -1;
};

std::vector<int64_t> rows_of(const std::vector<LoggedNet::Call>& calls) {
  std::vector<int64_t> r;
  for (const auto& c : calls) r.push_back(c.rows);
  std::sort(r.begin(), r.end(), std::greater<>());
  return r;
}

}  // namespace

TEST_CASE("DataParallel over several CPU replicas equals one device on the whole batch (odd batch sizes too)",
          "[unit][strategies][dp]") {
  struct Case {
    int devices;
    int64_t batch;
    std::vector<int64_t> chunks;  // torch's chunk(): ceil(batch / devices) rows each
  };
  for (const Case& c : {Case{2, 16, {8, 8}}, Case{3, 7, {3, 3, 1}}, Case{4, 5, {2, 2, 1}}}) {
    CAPTURE(c.devices, c.batch);
    LoggedNet net(1);
    lspawn::test::TinyNet ref(1);
    lspawn::DataParallel dp(std::vector<c10::Device>(c.devices, c10::Device(c10::kCPU)));
    lspawn::SingleDevice single(lspawn::AcceleratorKind::Cpu);
    dp.setup(net);
    single.setup(ref);
    REQUIRE(dp.num_devices() == c.devices);
    REQUIRE(dp.replicas().size() == static_cast<std::size_t>(c.devices - 1));
    auto opt = net.configure_optimizers();
    auto ref_opt = ref.configure_optimizers();
    const auto data = lspawn::test::tiny_data(c.batch * 4, 5);
    for (int64_t k = 0; k < 4; ++k) {
      const lspawn::Batch b = {data[0].slice(0, k * c.batch, (k + 1) * c.batch),
                               data[1].slice(0, k * c.batch, (k + 1) * c.batch)};
      opt->zero_grad();
      ref_opt->zero_grad();
      auto loss = dp.training_step(b, k);
      auto ref_loss = single.training_step(b, k);
      CHECK(std::abs(loss.item<double>() - ref_loss.item<double>()) < 1e-6);
      dp.backward(loss);
      single.backward(ref_loss);
      dp.optimizer_step(*opt);
      single.optimizer_step(*ref_opt);
      const auto calls = net.take();
      CHECK(rows_of(calls) == c.chunks);  // scattered, one call per chunk …
      std::set<std::thread::id> threads;
      for (const auto& call : calls) threads.insert(call.thread);
      CHECK(threads.size() == c.chunks.size());  // … each on its own thread
      for (const auto& call : calls) CHECK(call.grad);
    }
    CHECK(lspawn::test::max_abs_diff(net, ref) <= 1e-5);
    // The replicas' parameters are not leaves and never get a .grad; the root's do.
    for (const auto& p : net.parameters()) CHECK(p.grad().defined());
    for (const auto& p : dp.replicas().front()->parameters()) CHECK_FALSE(p.is_leaf());
  }
}

TEST_CASE(
    "DataParallel: Lightning's plain mean, validation metrics, predict gathers every row, bf16 autocast in replicas",
    "[unit][strategies][dp]") {
  const auto data = lspawn::test::tiny_data(7, 5);
  LoggedNet net(1);
  lspawn::DataParallelOptions o;
  o.reduction = lspawn::LossReduction::Mean;
  lspawn::DataParallel dp({c10::kCPU, c10::kCPU, c10::kCPU}, o);
  dp.setup(net);
  auto loss = dp.training_step(data, 0);
  // chunks 3, 3, 1: the mean of the three chunk losses, not the loss of the 7 rows.
  double manual = 0;
  for (int64_t begin : {0, 3, 6}) {
    const int64_t len = begin == 6 ? 1 : 3;
    manual +=
        at::nll_loss(at::log_softmax(net.forward(data[0].narrow(0, begin, len)), 1), data[1].narrow(0, begin, len))
            .item<double>() /
        3;
  }
  CHECK(std::abs(loss.item<double>() - manual) < 1e-6);
  net.take();

  lspawn::DataParallel weighted({c10::kCPU, c10::kCPU, c10::kCPU});
  LoggedNet net2(1);
  weighted.setup(net2);
  auto m = weighted.validation_step(data, 0);
  auto ref = net2.TinyNet::validation_step(data, 0);
  CHECK(std::abs(m.at("loss").item<double>() - ref.at("loss").item<double>()) < 1e-6);
  CHECK(std::abs(m.at("acc").item<double>() - ref.at("acc").item<double>()) < 1e-6);
  for (const auto& call : net2.take()) CHECK_FALSE(call.grad);  // NoGradGuard reaches the replica threads
  auto pred = weighted.predict_step(data, 0);
  CHECK(at::equal(pred, net2.TinyNet::predict_step(data, 0)));

  LoggedNet net3(1);
  lspawn::DataParallelOptions bf;
  bf.precision = lspawn::Precision::Bf16Mixed;
  lspawn::DataParallel bf16({c10::kCPU, c10::kCPU}, bf);
  bf16.setup(net3);
  bf16.training_step(data, 0);
  const auto calls = net3.take();
  REQUIRE(calls.size() == 2);
  for (const auto& call : calls) CHECK(call.autocast);
  CHECK_FALSE(lspawn::compat::autocast_enabled(at::kCPU));
}

TEST_CASE("DataParallel: a replica that throws is named with its device, every thread joined - the next step works",
          "[unit][strategies][dp]") {
  const auto data = lspawn::test::tiny_data(7, 5);
  LoggedNet net(1);
  net.throw_on_rows = 1;  // chunks 3, 3, 1: replica 2 throws
  lspawn::DataParallel dp({c10::kCPU, c10::kCPU, c10::kCPU});
  dp.setup(net);
  try {
    dp.training_step(data, 0);
    FAIL("no exception");
  } catch (const lspawn::ReplicaError& e) {
    CHECK(e.replica() == 2);
    CHECK(e.device() == c10::Device(c10::kCPU));
    CHECK_THAT(e.what(), Catch::Matchers::Contains("replica 2 on device cpu") &&
                             Catch::Matchers::Contains("training_step") &&
                             Catch::Matchers::Contains("replica step failed on purpose"));
  }
  CHECK(net.take().size() == 2);  // the other replicas ran to the end
  auto even = lspawn::Batch{data[0].slice(0, 0, 6), data[1].slice(0, 0, 6)};
  dp.backward(dp.training_step(even, 1));  // no thread left behind, the strategy still usable
  CHECK(net.take().size() == 3);
}

TEST_CASE("DataParallel: device and replica errors are clear", "[unit][strategies][dp]") {
  lspawn::test::TinyNet net(1);
  CHECK_THROWS_WITH(lspawn::DataParallel({c10::Device(c10::kCPU), c10::Device("cuda:0")}).setup(net),
                    Catch::Matchers::Contains("mix cpu and cuda:0"));
  const int visible = lspawn::Accelerator::device_count(lspawn::AcceleratorKind::Cuda);
  CHECK_THROWS_WITH(lspawn::DataParallel(std::vector<int>{0, visible}).setup(net),
                    Catch::Matchers::Contains("cuda:" + std::to_string(visible) + " asked for") &&
                        Catch::Matchers::Contains(std::to_string(visible) + " CUDA device(s) are visible"));
  CHECK_THROWS_WITH(lspawn::DataParallel({c10::Device(c10::kCUDA)}).setup(net), Catch::Matchers::Contains("no index"));
  struct Plain : lspawn::test::TinyNet {
    std::shared_ptr<lspawn::TrainingModule> make_replica() const override {
      return lspawn::TrainingModule::make_replica();
    }
  } plain;
  CHECK_THROWS_WITH(lspawn::DataParallel({c10::kCPU, c10::kCPU}).setup(plain),
                    Catch::Matchers::Contains("make_replica"));
  struct Other : lspawn::test::TinyNet {
    std::shared_ptr<lspawn::TrainingModule> make_replica() const override {
      struct Wider : lspawn::test::TinyNet {
        Wider() { fc3 = replace_module("fc3", torch::nn::Linear(32, 5)); }
      };
      return std::make_shared<Wider>();
    }
  } other;
  CHECK_THROWS_WITH(lspawn::DataParallel({c10::kCPU, c10::kCPU}).setup(other), Catch::Matchers::Contains("fc3.weight"));
  lspawn::DataParallel dp({c10::kCPU, c10::kCPU});
  dp.setup(net);
  CHECK_THROWS_WITH(dp.training_step({at::zeros({4, 8}), at::zeros({3}, at::kLong)}, 0),
                    Catch::Matchers::Contains("3 rows"));
}

TEST_CASE(
    "strategy backend: NCCL for a CUDA device when built with it, as torch - the user's choice and LSPAWN_BACKEND win",
    "[unit][strategies][backend]") {
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  // What a DDP user gets by default (docs/strategies.md#process-group).
  CHECK(lspawn::strategy_backend(lspawn::Backend::Default, cuda, true, nullptr) == lspawn::Backend::Nccl);
  CHECK(lspawn::strategy_backend(lspawn::Backend::Default, cpu, true, nullptr) == lspawn::Backend::Default);
  CHECK(lspawn::strategy_backend(lspawn::Backend::Default, cuda, false, nullptr) == lspawn::Backend::Default);
  CHECK(lspawn::strategy_backend(lspawn::Backend::Default, cuda, true, "") == lspawn::Backend::Nccl);
  // LSPAWN_BACKEND set: the Group reads it (shm on one GPU shared by several ranks, say).
  CHECK(lspawn::strategy_backend(lspawn::Backend::Default, cuda, true, "shm") == lspawn::Backend::Default);
  // An explicit choice is kept, whatever the device.
  CHECK(lspawn::strategy_backend(lspawn::Backend::Shm, cuda, true, nullptr) == lspawn::Backend::Shm);
  CHECK(lspawn::strategy_backend(lspawn::Backend::Gloo, cuda, true, "nccl") == lspawn::Backend::Gloo);
  CHECK(lspawn::strategy_backend(lspawn::Backend::Nccl, cpu, false, nullptr) == lspawn::Backend::Nccl);
}

TEST_CASE("device sharing: one process per GPU for NCCL, other backends put several local ranks on one GPU",
          "[unit][strategies][backend]") {
  using lspawn::Backend;
  using lspawn::DeviceSharing;
  // NCCL (torch's default for a CUDA model, or asked for) refuses two ranks on one GPU.
  CHECK(lspawn::strategy_device_sharing(Backend::Default, true, nullptr) == DeviceSharing::OnePerProcess);
  CHECK(lspawn::strategy_device_sharing(Backend::Nccl, true, nullptr) == DeviceSharing::OnePerProcess);
  CHECK(lspawn::strategy_device_sharing(Backend::Default, true, "nccl") == DeviceSharing::OnePerProcess);
  // shm/gloo (LSPAWN_BACKEND or asked) stage CUDA tensors through the host: ranks may share.
  CHECK(lspawn::strategy_device_sharing(Backend::Default, true, "shm") == DeviceSharing::Allowed);
  CHECK(lspawn::strategy_device_sharing(Backend::Default, true, "auto") == DeviceSharing::Allowed);
  CHECK(lspawn::strategy_device_sharing(Backend::Gloo, true, "nccl") == DeviceSharing::Allowed);
  CHECK(lspawn::strategy_device_sharing(Backend::Default, false, nullptr) == DeviceSharing::Allowed);

  CHECK(lspawn::cuda_device_index(1, 2, DeviceSharing::OnePerProcess) == 1);
  CHECK(lspawn::cuda_device_index(0, 1, DeviceSharing::Allowed) == 0);
  CHECK(lspawn::cuda_device_index(1, 1, DeviceSharing::Allowed) == 0);
  CHECK(lspawn::cuda_device_index(5, 2, DeviceSharing::Allowed) == 1);
  CHECK_THROWS_WITH(lspawn::cuda_device_index(1, 1, DeviceSharing::OnePerProcess),
                    Catch::Matchers::Contains("LOCAL_RANK 1 has no CUDA device: 1 visible") &&
                        Catch::Matchers::Contains("LSPAWN_BACKEND=shm or gloo lets ranks share one"));
  CHECK_THROWS_WITH(lspawn::cuda_device_index(0, 0, DeviceSharing::Allowed),
                    Catch::Matchers::Contains("LOCAL_RANK 0 has no CUDA device: 0 visible"));
  CHECK_THROWS_WITH(lspawn::cuda_device_index(-1, 2, DeviceSharing::Allowed),
                    Catch::Matchers::Contains("LOCAL_RANK -1"));
}
