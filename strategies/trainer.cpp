#include "strategies/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <sys/stat.h>

namespace lspawn {

namespace {

// Draws "epoch 2/5 [#####     ] 12/25" on stderr, redrawn in place. Does nothing when disabled.
class ProgressBar {
 public:
  ProgressBar(bool enabled, int64_t epoch, int64_t epochs, int64_t total)
      : enabled_(enabled), epoch_(epoch), epochs_(epochs), total_(total) {}
  void update(int64_t done) {
    if (!enabled_ || total_ <= 0) return;
    const int width = 30;
    const int filled = static_cast<int>(width * done / total_);
    std::fprintf(stderr, "\repoch %lld/%lld [%.*s%*s] %lld/%lld", static_cast<long long>(epoch_),
                 static_cast<long long>(epochs_), filled, "##############################", width - filled, "",
                 static_cast<long long>(done), static_cast<long long>(total_));
    std::fflush(stderr);
  }
  ~ProgressBar() {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool enabled_;
  int64_t epoch_, epochs_, total_;
};

void make_dirs(const std::string& dir) {
  std::string path;
  for (std::size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!path.empty()) ::mkdir(path.c_str(), 0755);
    }
    if (i < dir.size()) path += dir[i];
  }
}

// Sums (value · n) and n over ranks; returns the means. Every rank must pass the same keys.
std::map<std::string, double> global_means(Strategy& s, const std::map<std::string, double>& sums, double count) {
  std::vector<double> v;
  for (const auto& [k, x] : sums) v.push_back(x);
  v.push_back(count);
  auto t = at::tensor(v, at::kDouble);
  t = s.reduce(t, ReduceOp::Sum).toTensor();
  const double n = t[static_cast<int64_t>(v.size()) - 1].item<double>();
  std::map<std::string, double> out;
  int64_t i = 0;
  for (const auto& [k, x] : sums) out[k] = n > 0 ? t[i++].item<double>() / n : 0.0;
  return out;
}

}  // namespace

void Trainer::ensure_setup(TrainingModule& module) {
  if (!strategy_.is_setup() || &strategy_.module() != &module) strategy_.setup(module);
}

FitResult Trainer::fit(TrainingModule& module, const DataLoader& train, const std::optional<DataLoader>& val) {
  ensure_setup(module);
  auto optimizer = module.configure_optimizers();
  if (!optimizer) throw std::logic_error("Trainer::fit: configure_optimizers() returned no optimizer");
  DataLoader loader = strategy_.process_dataloader(train);
  std::optional<DataLoader> val_loader;
  if (val) val_loader = strategy_.process_dataloader(*val);

  FitResult result;
  int64_t start_epoch = 0;
  if (!options_.resume_from.empty()) {
    const Checkpoint ckpt = strategy_.load_checkpoint(options_.resume_from);
    ckpt.restore(module, optimizer.get());
    start_epoch = ckpt.epoch;
    result.epochs = ckpt.epoch;
    result.global_step = ckpt.global_step;
    result.metrics = ckpt.metrics;
  }
  if (!options_.checkpoint_dir.empty() && strategy_.is_global_zero()) make_dirs(options_.checkpoint_dir);
  const bool bar = options_.progress_bar && strategy_.is_global_zero() && ::isatty(2);
  const int64_t accumulate = std::max<int64_t>(1, options_.accumulate_grad_batches);

  for (int64_t epoch = start_epoch; epoch < options_.max_epochs; ++epoch) {
    module.train();
    loader.set_epoch(epoch);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0, samples = 0;
    const int64_t n = loader.size();
    {
      ProgressBar progress(bar, epoch + 1, options_.max_epochs, n);
      std::optional<ParallelLoader> prefetcher;
      if (strategy_.prefetch_batches() > 0)
        prefetcher.emplace(loader, strategy_.root_device(), strategy_.prefetch_batches());
      try {
        strategy_.zero_grad(*optimizer);
        for (int64_t i = 0; i < n; ++i) {
          const Batch batch = prefetcher ? *prefetcher->next() : strategy_.batch_to_device(loader.batch(i));
          const bool step = (i + 1) % accumulate == 0 || i + 1 == n;
          at::Tensor loss;
          if (!step) {
            NoSync no_sync(strategy_);
            loss = strategy_.training_step(batch, i);
            strategy_.backward(accumulate > 1 ? loss / static_cast<double>(accumulate) : loss);
          } else {
            loss = strategy_.training_step(batch, i);
            strategy_.backward(accumulate > 1 ? loss / static_cast<double>(accumulate) : loss);
            strategy_.optimizer_step(*optimizer);
            strategy_.zero_grad(*optimizer);
            ++result.global_step;
            if (result.first_step_ns == 0)
              result.first_step_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now().time_since_epoch())
                                         .count();
          }
          const double rows = batch.empty() ? 0.0 : static_cast<double>(batch[0].size(0));
          loss_sum += loss.detach().item<double>() * rows;
          samples += rows;
          progress.update(i + 1);
        }
      } catch (const std::exception& e) {
        strategy_.on_exception(e);
        throw;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto means = global_means(strategy_, {{"train_loss", loss_sum}}, samples);
    const double all_samples = samples * strategy_.world_size();
    result.metrics["train_loss"] = means["train_loss"];
    if (val_loader) {
      for (const auto& [k, v] : evaluate(module, *val_loader, false, "val_")) result.metrics[k] = v;
    }
    result.epochs = epoch + 1;
    if (options_.print_epochs && strategy_.is_global_zero()) {
      std::printf("epoch %lld/%lld: train_loss %.4f, %.0f samples/s", static_cast<long long>(epoch + 1),
                  static_cast<long long>(options_.max_epochs), result.metrics["train_loss"],
                  seconds > 0 ? all_samples / seconds : 0.0);
      for (const auto& [k, v] : result.metrics)
        if (k.rfind("val_", 0) == 0) std::printf(", %s %.4f", k.c_str(), v);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (!options_.checkpoint_dir.empty()) {
      Checkpoint ckpt = Checkpoint::capture(module, optimizer.get(), epoch + 1, result.global_step);
      ckpt.metrics = result.metrics;
      const std::string last = options_.checkpoint_dir + "/last.ckpt";
      strategy_.save_checkpoint(ckpt, last);
      if (options_.keep_every_epoch)
        strategy_.save_checkpoint(ckpt, options_.checkpoint_dir + "/epoch=" + std::to_string(epoch + 1) + ".ckpt");
      strategy_.barrier("Trainer.save_checkpoint");
      result.last_checkpoint = last;
    }
  }
  result.metrics["epochs"] = static_cast<double>(result.epochs);
  return result;
}

std::map<std::string, double> Trainer::evaluate(TrainingModule& module, const DataLoader& loader, bool test,
                                                const std::string& prefix) {
  module.eval();
  std::map<std::string, double> sums;
  double samples = 0;
  const int64_t n = loader.size();
  try {
    for (int64_t i = 0; i < n; ++i) {
      const Batch batch = strategy_.batch_to_device(loader.batch(i));
      const StepMetrics m = test ? strategy_.test_step(batch, i) : strategy_.validation_step(batch, i);
      const double rows = batch.empty() ? 0.0 : static_cast<double>(batch[0].size(0));
      for (const auto& [k, v] : m) sums[prefix + k] += v.detach().to(at::kDouble).item<double>() * rows;
      samples += rows;
    }
  } catch (const std::exception& e) {
    strategy_.on_exception(e);
    throw;
  }
  module.train();
  // Ranks with no batch still take part; the names come from rank 0 (broadcast) so every rank
  // reduces the same vector.
  c10::List<std::string> names;
  for (const auto& [k, v] : sums) names.push_back(k);
  const c10::List<c10::IValue> agreed = strategy_.broadcast(c10::IValue(names), 0).toList();
  std::map<std::string, double> aligned;
  for (size_t i = 0; i < agreed.size(); ++i) {
    const std::string k = agreed.get(i).toStringRef();
    aligned[k] = sums.count(k) ? sums[k] : 0.0;
  }
  return global_means(strategy_, aligned, samples);
}

std::map<std::string, double> Trainer::validate(TrainingModule& module, const DataLoader& loader) {
  ensure_setup(module);
  return evaluate(module, strategy_.process_dataloader(loader), false, "val_");
}

std::map<std::string, double> Trainer::test(TrainingModule& module, const DataLoader& loader) {
  ensure_setup(module);
  return evaluate(module, strategy_.process_dataloader(loader), true, "test_");
}

at::Tensor Trainer::predict(TrainingModule& module, const DataLoader& loader) {
  ensure_setup(module);
  DataLoader mine = strategy_.process_dataloader(loader);
  module.eval();
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < mine.size(); ++i)
    out.push_back(strategy_.predict_step(strategy_.batch_to_device(mine.batch(i)), i));
  module.train();
  return out.empty() ? at::Tensor() : at::cat(out);
}

}  // namespace lspawn
