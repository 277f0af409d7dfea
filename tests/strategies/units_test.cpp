// In-process tests of the strategies' pieces that need no peers: DistributedSampler arithmetic,
// DataLoader, checkpoint files, precision plugin, ParallelLoader, SingleDevice / DataParallel
// through the Trainer.
#include "strategies/checkpoint.hpp"
#include "strategies/data.hpp"
#include "strategies/data_parallel.hpp"
#include "strategies/precision.hpp"
#include "strategies/spawn_strategies.hpp"
#include "strategies/trainer.hpp"
#include "tests/runtime/child.hpp"
#include "tests/strategies/model.hpp"

#include <set>

#include <catch2/catch.hpp>

using lspawn::DistributedSampler;

TEST_CASE("DistributedSampler: torch's padding, drop_last and per-rank interleaving", "[strategies][data]") {
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

TEST_CASE("DistributedSampler: shuffle shared by ranks, new order per epoch, shards disjoint", "[strategies][data]") {
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

TEST_CASE("DataLoader: batches, drop_last, distributed shard", "[strategies][data]") {
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

TEST_CASE("ParallelLoader prefetches the loader's batches in order and rethrows errors", "[strategies][data]") {
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

TEST_CASE("checkpoint files: round trip, atomic replace, clear errors", "[strategies][checkpoint]") {
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

TEST_CASE("precision: bf16-mixed autocasts on CPU inside the scope only; 16-mixed refuses CPU", "[strategies][precision]") {
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

TEST_CASE("SingleDevice / DataParallel (one device) through the Trainer: fit, validate, test, predict", "[strategies][trainer]") {
  auto data = lspawn::test::tiny_data(256, 4);
  lspawn::DataLoader train(lspawn::TensorDataset(data), {16, true, 1, false});
  for (int dp = 0; dp < 2; ++dp) {
    lspawn::test::TinyNet net(1);
    std::unique_ptr<lspawn::Strategy> s;
    if (dp) s = std::make_unique<lspawn::DataParallel>();
    else s = std::make_unique<lspawn::SingleDevice>(lspawn::AcceleratorKind::Cpu, lspawn::Precision::Bf16Mixed);
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

TEST_CASE("Trainer: accumulate_grad_batches steps once per group", "[strategies][trainer]") {
  lspawn::test::TinyNet net(1);
  lspawn::SingleDevice s(lspawn::AcceleratorKind::Cpu);
  lspawn::TrainerOptions o;
  o.accumulate_grad_batches = 3;
  o.print_epochs = false;
  lspawn::Trainer t(s, o);
  auto r = t.fit(net, lspawn::DataLoader(lspawn::TensorDataset(lspawn::test::tiny_data(40, 2)), {4, false, 0, false}));
  CHECK(r.global_step == 4);  // 10 batches: steps after 3, 6, 9 and the last
}

TEST_CASE("Trainer: an exception in training_step propagates after on_exception", "[strategies][trainer]") {
  lspawn::test::TinyNet net(1);
  net.throw_at = 1;
  lspawn::SingleDevice s(lspawn::AcceleratorKind::Cpu);
  lspawn::Trainer t(s, {});
  CHECK_THROWS_WITH(t.fit(net, lspawn::DataLoader(lspawn::TensorDataset(lspawn::test::tiny_data(8, 2)), {2, false, 0, false})),
                    Catch::Matchers::Contains("failed on purpose at batch 1"));
}

TEST_CASE("DDPSpawn with nprocs = 1 trains in the caller on one device", "[strategies][spawn]") {
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
