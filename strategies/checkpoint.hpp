// Checkpoint: the state a run resumes from, and its file format.
//
// A checkpoint file is torch::pickle_save of a dict {"format": 1, "epoch", "global_step",
// "model": {name: tensor} (parameters and buffers, CPU), "optimizer": bytes of
// Optimizer::save(), "metrics": {name: float}}. Written atomically: a temp file in the same
// directory, fsync, rename over the target, fsync of the directory — a reader sees the old file
// or the new one, never a torn one. Strategy::save_checkpoint writes on global rank 0 only.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "proto/error.hpp"

namespace lspawn {

class CheckpointError : public lspawn::Error {
 public:
  using lspawn::Error::Error;
};

struct Checkpoint {
  int64_t epoch = 0;                        // epochs completed
  int64_t global_step = 0;                  // optimizer steps taken
  std::map<std::string, at::Tensor> model;  // named parameters and buffers (CPU copies)
  std::string optimizer;                    // Optimizer::save() archive, empty when none
  std::map<std::string, double> metrics;

  // Captures the module (and the optimizer, when given).
  static Checkpoint capture(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer, int64_t epoch,
                            int64_t global_step);
  // Copies the state into `module` (same names and shapes; CheckpointError naming the first
  // mismatch) and `optimizer` (when given and saved).
  void restore(torch::nn::Module& module, torch::optim::Optimizer* optimizer) const;
};

// Named parameters and buffers of `module`, detached CPU copies.
std::map<std::string, at::Tensor> module_state(const torch::nn::Module& module);
// Copies `state` into `module`'s parameters and buffers. CheckpointError on a missing name or shape.
void load_module_state(torch::nn::Module& module, const std::map<std::string, at::Tensor>& state);

// The file format above. CheckpointError naming the path on any failure.
void write_checkpoint_file(const Checkpoint& ckpt, const std::string& path);
Checkpoint read_checkpoint_file(const std::string& path);

}  // namespace lspawn
