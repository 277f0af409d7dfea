// DataParallel: one process, several devices (Lightning's DataParallelStrategy, i.e.
// torch.nn.DataParallel under Lightning's step reduction).
//
//   lspawn::DataParallel dp({at::Device("cuda:0"), at::Device("cuda:1")});   // or {} = every GPU
//   lspawn::Trainer(dp, options).fit(net, train);
//
// Per step (training, validation, test, predict):
//   - replicate: replica 0 is the module itself (on the root device, devices[0]); replicas
//     1..n-1 are made once at setup() by the module's make_replica() (module.hpp) and moved to
//     their devices; before every step they receive the root's parameters, buffers and
//     train/eval mode (torch's DP broadcasts them every forward). Each replica parameter's
//     gradient edge leads to the root parameter (through one summing node per parameter that
//     moves the gradients to the root device), so backward() of the reduced loss leaves in the
//     root's .grad the sum over replicas — the optimizer steps the root only.
//   - scatter: every batch tensor is split along dim 0 with tensor.chunk(n) (torch's scatter:
//     chunks of ceil(rows / n) rows, so a small batch may use fewer than n replicas); 0-dim and
//     undefined tensors go to every replica whole; tensors with another row count are an error.
//   - parallel apply: replica i runs its step on a thread of its own (replica 0 on the calling
//     thread) with the caller's grad mode and thread-local state and the precision plugin's
//     autocast, its device current.
//   - gather + reduce: training losses (scalars) are gathered onto the root device and reduced
//     (see LossReduction); validation/test metrics are reduced the same way per name; predict
//     outputs are concatenated along dim 0 on the root device.
//   - A replica that throws: every thread is joined first, then ReplicaError names the replica,
//     its device, the step and the replica's message (torch: "Caught … in replica 1 on device 1").
//
// With one device (or none given and at most one CUDA device visible) it runs as SingleDevice:
// no replica, no thread. Devices must all be CPU or all CUDA (with an index); several CPU
// entries give several CPU replicas — the same arithmetic as several GPUs, used by the tests.
#pragma once

#include "strategies/strategy.hpp"
#include "proto/error.hpp"

#include <c10/core/Device.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace lspawn {

// How the replicas' scalar outputs (loss, metrics) become one.
enum class LossReduction {
  // Σ value_i · rows_i / rows: replica i's value weighted by its share of the batch's rows.
  // Equals Lightning's mean when every chunk has the same size, and equals one device on the
  // whole batch for losses that are means over rows, also when the batch does not divide.
  RowWeighted,
  // Lightning's DataParallelStrategy.reduce: the plain mean over replicas (a short last chunk
  // weighs as much as a full one).
  Mean,
};

struct DataParallelOptions {
  Precision precision = Precision::F32True;
  LossReduction reduction = LossReduction::RowWeighted;
};

// A replica's step threw. what(): "DataParallel: replica R on device D failed in STEP: <message>".
class ReplicaError : public lspawn::Error {
 public:
  ReplicaError(int replica, c10::Device device, const std::string& step, const std::string& message);
  int replica() const { return replica_; }
  const c10::Device& device() const { return device_; }

 private:
  int replica_;
  c10::Device device_;
};

class DataParallel : public Strategy {
 public:
  // devices: empty → every visible CUDA device (CPU when none).
  explicit DataParallel(std::vector<c10::Device> devices = {}, DataParallelOptions options = {});
  // CUDA device indices (cuda:i for each i).
  explicit DataParallel(const std::vector<int>& cuda_devices, DataParallelOptions options = {});
  ~DataParallel() override;

  void setup_environment() override;
  void setup(TrainingModule& module) override;
  void teardown() override;
  c10::Device root_device() const override;

  at::Tensor training_step(const Batch& batch, int64_t batch_idx) override;
  StepMetrics validation_step(const Batch& batch, int64_t batch_idx) override;
  StepMetrics test_step(const Batch& batch, int64_t batch_idx) override;
  at::Tensor predict_step(const Batch& batch, int64_t batch_idx) override;

  // Devices the batch is split over (after setup_environment()).
  int num_devices() const { return static_cast<int>(devices_.size()); }
  const std::vector<c10::Device>& devices() const { return devices_; }
  // Replicas 1..n-1 (after setup()); replica 0 is the module.
  const std::vector<std::shared_ptr<TrainingModule>>& replicas() const { return replicas_; }

 private:
  struct Chunks;
  Chunks scatter(const Batch& batch) const;
  void sync_replicas(std::size_t count);
  template <typename R, typename F>
  std::vector<R> parallel_apply(const Chunks& chunks, const char* step, F&& fn);
  StepMetrics reduce_metrics(const std::vector<StepMetrics>& outputs, const Chunks& chunks, const char* step) const;

  std::vector<c10::Device> requested_;
  std::vector<c10::Device> devices_;
  DataParallelOptions options_;
  bool environment_ready_ = false;
  // Replica parameters hold the summing autograd nodes (their grad_fn) that lead to the root's.
  std::vector<std::shared_ptr<TrainingModule>> replicas_;
};

}  // namespace lspawn
