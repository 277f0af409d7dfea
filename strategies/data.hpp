// Data for the strategies: an in-memory TensorDataset, torch's DistributedSampler semantics, a
// DataLoader that makes batches from them, and the XLA-style ParallelLoader (a thread that
// prefetches batches onto the device).
//
//   DataLoader train(TensorDataset({x, y}), {/*batch_size=*/32, /*shuffle=*/true});
//   DataLoader mine = strategy.process_dataloader(train);   // this rank's shard
//   for (int64_t epoch = 0; ...) { mine.set_epoch(epoch); for (int64_t i = 0; i < mine.size(); ++i) mine.batch(i); }
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace lspawn {

// One batch: the dataset's tensors indexed by the same rows (e.g. {input, target}).
using Batch = std::vector<at::Tensor>;

// Rows of several tensors that share dim 0 (features, labels, ...). Throws std::invalid_argument
// when the tensors are empty or their first dimensions differ.
class TensorDataset {
 public:
  TensorDataset() = default;
  explicit TensorDataset(std::vector<at::Tensor> tensors);
  int64_t size() const { return size_; }
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  // The rows `indices` (int64, 1-D) of every tensor.
  Batch rows(const at::Tensor& indices) const;

 private:
  std::vector<at::Tensor> tensors_;
  int64_t size_ = 0;
};

// torch.utils.data.DistributedSampler, same arithmetic:
//   drop_last and size % replicas != 0: num_samples = ceil((size - replicas) / replicas)
//   otherwise:                          num_samples = ceil(size / replicas)
//   total = num_samples * replicas; the order is randperm(size) seeded with seed + epoch when
//   shuffle (the same on every rank: they share the seed), else 0..size-1; padded by repeating
//   its head up to total (or truncated to total with drop_last); rank r takes positions
//   r, r + replicas, r + 2·replicas, ...
// Every rank gets the same number of samples, so every rank runs the same number of steps.
struct DistributedSampler {
  int64_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int64_t epoch = 0;  // set_epoch() before each epoch changes the shuffle

  // Throws std::invalid_argument for rank outside [0, num_replicas) or num_replicas < 1.
  void validate() const;
  int64_t num_samples() const;
  int64_t total_size() const { return num_samples() * num_replicas; }
  void set_epoch(int64_t e) { epoch = e; }
  // This rank's indices for the current epoch (num_samples() of them).
  std::vector<int64_t> indices() const;
};

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;  // without a sampler: randperm seeded with seed + epoch
  uint64_t seed = 0;
  bool drop_last = false;  // drop the last incomplete batch (and, distributed, the sampler's tail)
};

class DataLoader {
 public:
  DataLoader() = default;
  DataLoader(TensorDataset dataset, LoaderOptions options);

  // The same data and options, sharded for `rank` of `replicas` with a DistributedSampler
  // (shuffle, seed and drop_last taken from the options).
  DataLoader distributed(int rank, int replicas) const;

  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Number of batches of the current epoch.
  int64_t size() const;
  // Batch i of the current epoch (0 <= i < size(); std::out_of_range otherwise).
  Batch batch(int64_t i) const;
  // Samples this loader yields per epoch.
  int64_t num_samples() const { return static_cast<int64_t>(order_.size()); }

  const TensorDataset& dataset() const { return dataset_; }
  const LoaderOptions& options() const { return options_; }
  const std::optional<DistributedSampler>& sampler() const { return sampler_; }

 private:
  void reorder();
  TensorDataset dataset_;
  LoaderOptions options_;
  std::optional<DistributedSampler> sampler_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;  // indices of the current epoch
};

// torch_xla's ParallelLoader/MpDeviceLoader: a background thread produces batches 0..n-1 of
// the loader's current epoch, moves them to `device` (non_blocking) and queues up to
// `prefetch` of them; next() hands them out in order. An exception in the thread is rethrown
// by next(). The destructor stops and joins the thread.
class ParallelLoader {
 public:
  ParallelLoader(const DataLoader& loader, c10::Device device, int prefetch = 2);
  ~ParallelLoader();
  ParallelLoader(const ParallelLoader&) = delete;
  ParallelLoader& operator=(const ParallelLoader&) = delete;
  // The next batch, or nullopt after the last one.
  std::optional<Batch> next();
  int64_t size() const { return size_; }

 private:
  void run(DataLoader loader, c10::Device device);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  std::exception_ptr error_;
  int64_t produced_ = 0, consumed_ = 0, size_ = 0;
  int prefetch_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lspawn
