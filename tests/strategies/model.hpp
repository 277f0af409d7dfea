// A small deterministic MLP and data for the strategies tests (worker and in-process tests).
#pragma once

#include <chrono>
#include <thread>

#include "strategies/module.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace lspawn::test {

struct TinyNet : lspawn::TrainingModule {
  explicit TinyNet(uint64_t seed = 1) {
    at::manual_seed(seed);
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return fc3(at::tanh(fc2(at::tanh(fc1(x))))); }
  at::Tensor training_step(const lspawn::Batch& b, int64_t idx) override {
    if (throw_at >= 0 && idx == throw_at)
      throw std::runtime_error("training_step failed on purpose at batch " + std::to_string(idx));
    if (stall_at >= 0 && idx == stall_at) stalled_between_backward_passes();
    return at::nll_loss(at::log_softmax(forward(b[0]), 1), b[1]);
  }
  lspawn::StepMetrics validation_step(const lspawn::Batch& b, int64_t) override {
    const auto out = forward(b[0]);
    return {{"loss", at::nll_loss(at::log_softmax(out, 1), b[1])},
            {"acc", out.argmax(1).eq(b[1]).to(at::kFloat).mean()}};
  }
  at::Tensor predict_step(const lspawn::Batch& b, int64_t) override { return forward(b[0]).argmax(1); }
  std::shared_ptr<lspawn::TrainingModule> make_replica() const override {
    auto r = std::make_shared<TinyNet>();
    r->lr = lr;
    r->throw_at = throw_at;
    r->stall_at = stall_at;
    return r;
  }
  std::shared_ptr<torch::optim::Optimizer> configure_optimizers() override {
    return std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  double lr = 0.05;
  int64_t throw_at = -1;
  int64_t stall_at = -1;  // this rank sleeps at batch stall_at (after the previous backward pass)

  // Named so that a hang report's stack shows where the rank is (the worker exports its symbols).
  __attribute__((noinline)) static void stalled_between_backward_passes() {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
  }
};

// `rows` samples of 8 features and 4 classes, deterministic in `seed`.
inline std::vector<at::Tensor> tiny_data(int64_t rows, uint64_t seed) {
  at::manual_seed(seed);
  auto x = at::randn({rows, 8});
  auto y = (x.slice(1, 0, 2).sum(1) > 0).to(at::kLong) * 2 + (x.slice(1, 2, 4).sum(1) > 0).to(at::kLong);
  return {x, y};
}

inline double max_abs_diff(torch::nn::Module& a, torch::nn::Module& b) {
  double m = 0;
  auto pa = a.named_parameters(true);
  auto pb = b.named_parameters(true);
  for (const auto& p : pa) m = std::max(m, (p.value() - pb[p.key()]).abs().max().item<double>());
  return m;
}

}  // namespace lspawn::test
