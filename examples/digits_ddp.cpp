// digits_ddp: an MLP on scikit-learn's digits (1797 8×8 images, 10 classes; Debian's
// python3-sklearn ships them as digits.csv.gz), trained data-parallel on lspawn's strategies.
//
//   lspawn --nprocs 4 build/examples/digits_ddp            # DDP: one worker per rank
//   build/examples/digits_ddp --spawn 4                     # DDPSpawn: fit() starts 4 workers
//   build/examples/digits_ddp --spawn 4 --start fork        # ... forked instead of exec'd
//   lspawn --nprocs 1 build/examples/digits_ddp --accelerator cuda --precision bf16-mixed
//   options: --epochs E (15) --csv PATH --batch B (32 per rank) --lr LR (0.003)
//            --accelerator cpu|cuda|auto (cpu) --precision 32-true|bf16-mixed|16-mixed (32-true)
//
// Prints (rank 0) the device, precision and the strategy group's backend (DDP: NCCL by default
// when the device is CUDA and NCCL is built, docs/strategies.md), then "test accuracy A" on the
// held-out 20 % (360 images).
#include <lspawn/runtime.hpp>
#include <lspawn/spawn.hpp>
#include <lspawn/strategies.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

const char* kDigitsCsv = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct DigitsNet : lspawn::TrainingModule {
  DigitsNet() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 10));
  }
  at::Tensor forward(const at::Tensor& x) { return fc3(at::relu(fc2(at::relu(fc1(x))))); }
  at::Tensor training_step(const lspawn::Batch& b, int64_t) override {
    return at::nll_loss(at::log_softmax(forward(b[0]), 1), b[1]);
  }
  lspawn::StepMetrics validation_step(const lspawn::Batch& b, int64_t) override {
    const auto out = forward(b[0]);
    return {{"loss", at::nll_loss(at::log_softmax(out, 1), b[1])},
            {"accuracy", out.argmax(1).eq(b[1]).to(at::kFloat).mean()}};
  }
  std::shared_ptr<torch::optim::Optimizer> configure_optimizers() override {
    return std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  double lr = 0.003;
};

LSPAWN_REGISTER_SPAWN_FIT(DigitsNet);

// Reads the gzip'd CSV through `gzip -dc` (64 pixel values 0..16, then the label, per line).
std::pair<at::Tensor, at::Tensor> load_digits(const std::string& path) {
  const std::string cmd = "gzip -dc '" + path + "'";
  FILE* in = ::popen(cmd.c_str(), "r");
  if (!in) throw std::runtime_error("cannot run " + cmd);
  std::vector<float> x;
  std::vector<int64_t> y;
  char line[4096];
  while (std::fgets(line, sizeof line, in)) {
    std::stringstream ss(line);
    std::string cell;
    std::vector<float> row;
    while (std::getline(ss, cell, ',')) row.push_back(std::stof(cell));
    if (row.size() != 65) continue;
    x.insert(x.end(), row.begin(), row.begin() + 64);
    y.push_back(static_cast<int64_t>(row[64]));
  }
  const int status = ::pclose(in);
  if (status != 0 || y.empty())
    throw std::runtime_error(path + ": no digits read (is python3-sklearn installed? gzip status " +
                             std::to_string(status) + ")");
  const int64_t n = static_cast<int64_t>(y.size());
  return {at::tensor(x).reshape({n, 64}) / 16.0, at::tensor(y, at::kLong)};
}

struct Args {
  int spawn = 0;
  std::string start = "spawn";
  int64_t epochs = 15, batch = 32;
  double lr = 0.003;
  std::string csv = kDigitsCsv;
  lspawn::AcceleratorKind accelerator = lspawn::AcceleratorKind::Cpu;
  lspawn::Precision precision = lspawn::Precision::F32True;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--spawn")
      a.spawn = std::stoi(value());
    else if (k == "--start")
      a.start = value();
    else if (k == "--epochs")
      a.epochs = std::stoll(value());
    else if (k == "--batch")
      a.batch = std::stoll(value());
    else if (k == "--lr")
      a.lr = std::stod(value());
    else if (k == "--csv")
      a.csv = value();
    else if (k == "--accelerator")
      a.accelerator = lspawn::parse_accelerator(value());
    else if (k == "--precision")
      a.precision = lspawn::parse_precision(value());
    else
      throw std::invalid_argument("unknown option " + k);
  }
  return a;
}

}  // namespace

int digits_main(int argc, char** argv);

// A failure is reported as every lspawn worker's is: the exception on stderr and in the error
// file (docs/error-reports.md), exit status 1.
int main(int argc, char** argv) {
  // A DDPSpawn worker started by exec runs its part and exits inside init(). `--start forkserver`:
  // the server is forked now, before the data preparation below starts LibTorch's thread pools
  // (which rule out forking later: LibTorch 2.x starts them on first use).
  lspawn::StartupOptions startup;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--start" && std::string(argv[i + 1]) == "forkserver") startup.start_forkserver = true;
  }
  lspawn::init(argc, argv, startup);
  return lspawn::run_main(argc, argv, digits_main);
}

int digits_main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "digits_ddp: %s\n", e.what());
    return 2;
  }
  auto [x, y] = load_digits(args.csv);
  // A fixed 80/20 split, the same in every process.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto perm = at::randperm(x.size(0), gen, at::TensorOptions().dtype(at::kLong));
  const int64_t n_train = x.size(0) - 360;
  const auto tr = perm.slice(0, 0, n_train), te = perm.slice(0, n_train);
  lspawn::DataLoader train(lspawn::TensorDataset({x.index_select(0, tr), y.index_select(0, tr)}),
                           {args.batch, /*shuffle=*/true, /*seed=*/42, /*drop_last=*/false});
  lspawn::DataLoader test(lspawn::TensorDataset({x.index_select(0, te), y.index_select(0, te)}),
                          {128, false, 0, false});

  lspawn::TrainerOptions topt;
  topt.max_epochs = args.epochs;
  at::manual_seed(0);
  auto net = std::make_shared<DigitsNet>();
  net->lr = args.lr;

  if (args.spawn > 0) {
    lspawn::SpawnStrategyOptions so;
    so.nprocs = args.spawn;
    so.start_method = args.start == "fork"         ? lspawn::StartMethod::Fork
                      : args.start == "forkserver" ? lspawn::StartMethod::Forkserver
                                                   : lspawn::StartMethod::Spawn;
    so.ddp.accelerator = args.accelerator;
    so.ddp.precision = args.precision;
    lspawn::DDPSpawn strategy(so);
    const auto r = strategy.fit(net, train, std::nullopt, topt);
    // The caller's module now holds rank 0's weights: evaluate here, in one process.
    lspawn::SingleDevice single(lspawn::AcceleratorKind::Cpu);
    lspawn::Trainer evaluator(single, {});
    const auto m = evaluator.test(*net, test);
    std::printf("DDPSpawn (%d workers, %s, %s, %s): train_loss %.4f after %lld steps, first step %.3f s after fit()\n",
                args.spawn, args.start.c_str(), lspawn::to_string(args.accelerator), lspawn::to_string(args.precision),
                r.metrics.at("train_loss"), static_cast<long long>(r.global_step), r.time_to_first_step);
    std::printf("test accuracy %.4f\n", m.at("test_accuracy"));
    return 0;
  }

  lspawn::DDPOptions o;
  o.accelerator = args.accelerator;
  o.precision = args.precision;
  lspawn::DDP strategy(o);
  lspawn::Trainer trainer(strategy, topt);
  trainer.fit(*net, train);
  if (strategy.is_global_zero()) {
    std::printf("DDP on %s, %s, backend %s, %d ranks\n", strategy.root_device().str().c_str(),
                lspawn::to_string(args.precision), strategy.group().backend().c_str(), strategy.world_size());
  }
  const auto m = trainer.test(*net, test);
  if (strategy.is_global_zero()) std::printf("test accuracy %.4f\n", m.at("test_accuracy"));
  return 0;
}
