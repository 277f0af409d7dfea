#include "strategies/data.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>

namespace lspawn {

TensorDataset::TensorDataset(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
  if (tensors_.empty()) throw std::invalid_argument("TensorDataset: no tensors");
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i].defined() || tensors_[i].dim() == 0)
      throw std::invalid_argument("TensorDataset: tensor " + std::to_string(i) + " is undefined or 0-dim");
    if (tensors_[i].size(0) != tensors_[0].size(0))
      throw std::invalid_argument("TensorDataset: tensor " + std::to_string(i) + " has " +
                                  std::to_string(tensors_[i].size(0)) + " rows, tensor 0 has " +
                                  std::to_string(tensors_[0].size(0)));
  }
  size_ = tensors_[0].size(0);
}

Batch TensorDataset::rows(const at::Tensor& indices) const {
  Batch b;
  b.reserve(tensors_.size());
  for (const auto& t : tensors_) b.push_back(t.index_select(0, indices));
  return b;
}

void DistributedSampler::validate() const {
  if (num_replicas < 1) throw std::invalid_argument("DistributedSampler: num_replicas " + std::to_string(num_replicas));
  if (rank < 0 || rank >= num_replicas)
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " not in [0, " +
                                std::to_string(num_replicas) + ")");
}

int64_t DistributedSampler::num_samples() const {
  const int64_t n = dataset_size, r = num_replicas;
  if (drop_last && n % r != 0) return n >= r ? (n - r + r - 1) / r : 0;  // ceil((n - r) / r)
  return (n + r - 1) / r;
}

namespace {
std::vector<int64_t> permutation(int64_t n, bool shuffle, uint64_t seed) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  if (shuffle) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = p[i];
  } else {
    for (int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  }
  return order;
}
}  // namespace

std::vector<int64_t> DistributedSampler::indices() const {
  validate();
  std::vector<int64_t> all = permutation(dataset_size, shuffle, seed + static_cast<uint64_t>(epoch));
  const int64_t total = total_size();
  if (!drop_last) {
    const int64_t pad = total - static_cast<int64_t>(all.size());
    for (int64_t i = 0; i < pad && !all.empty(); ++i) all.push_back(all[static_cast<std::size_t>(i) % all.size()]);
  } else {
    all.resize(static_cast<std::size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples()));
  for (int64_t i = rank; i < total; i += num_replicas) mine.push_back(all[static_cast<std::size_t>(i)]);
  return mine;
}

DataLoader::DataLoader(TensorDataset dataset, LoaderOptions options) : dataset_(std::move(dataset)), options_(options) {
  if (options_.batch_size < 1)
    throw std::invalid_argument("DataLoader: batch_size " + std::to_string(options_.batch_size) + " < 1");
  reorder();
}

DataLoader DataLoader::distributed(int rank, int replicas) const {
  DataLoader d = *this;
  DistributedSampler s;
  s.dataset_size = dataset_.size();
  s.num_replicas = replicas;
  s.rank = rank;
  s.shuffle = options_.shuffle;
  s.seed = options_.seed;
  s.drop_last = options_.drop_last;
  s.epoch = epoch_;
  s.validate();
  d.sampler_ = s;
  d.reorder();
  return d;
}

void DataLoader::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  if (sampler_) sampler_->set_epoch(epoch);
  reorder();
}

void DataLoader::reorder() {
  if (sampler_)
    order_ = sampler_->indices();
  else
    order_ = permutation(dataset_.size(), options_.shuffle, options_.seed + static_cast<uint64_t>(epoch_));
}

int64_t DataLoader::size() const {
  const int64_t n = num_samples(), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

Batch DataLoader::batch(int64_t i) const {
  if (i < 0 || i >= size())
    throw std::out_of_range("DataLoader: batch " + std::to_string(i) + " of " + std::to_string(size()));
  const int64_t begin = i * options_.batch_size;
  const int64_t end = std::min(begin + options_.batch_size, num_samples());
  auto idx = at::empty({end - begin}, at::kLong);
  int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t k = begin; k < end; ++k) p[k - begin] = order_[static_cast<std::size_t>(k)];
  return dataset_.rows(idx);
}

ParallelLoader::ParallelLoader(const DataLoader& loader, c10::Device device, int prefetch)
    : size_(loader.size()), prefetch_(prefetch < 1 ? 1 : prefetch) {
  thread_ = std::thread([this, loader, device] { run(loader, device); });
}

ParallelLoader::~ParallelLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ParallelLoader::run(DataLoader loader, c10::Device device) {
  try {
    for (int64_t i = 0; i < size_; ++i) {
      Batch b = loader.batch(i);
      for (auto& t : b) t = t.to(device, /*non_blocking=*/true);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < prefetch_; });
      if (stop_) return;
      queue_.push_back(std::move(b));
      ++produced_;
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

std::optional<Batch> ParallelLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (consumed_ >= size_) return std::nullopt;
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  ++consumed_;
  cv_.notify_all();
  return b;
}

}  // namespace lspawn
