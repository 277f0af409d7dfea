// spawn() with LibTorch values: tensor arguments and results, ModelWrapper, a gloo process
// group inside the workers, for every start method.

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <lspawn/model_wrapper.hpp>
#include <lspawn/spawn.hpp>
#include <lspawn/tensor_codec.hpp>

#include "collectives/group.hpp"
#include "collectives/ops.hpp"
#include "runtime/process_group.hpp"
#include "supervisor/worker_failure.hpp"
#include "support/files.hpp"
#include "support/temp_dir.hpp"
#include "support/wait.hpp"

#include <cerrno>
#include <chrono>
#include <ctime>
#include <stdexcept>
#include <thread>
// Last: c10's glog headers define CHECK too; Catch's must win.
#include <catch2/catch.hpp>

using lspawn::SpawnOptions;
using lspawn::StartMethod;

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", torch::nn::Linear(64, 32));
    register_buffer("steps", at::zeros({1}, at::kLong));
  }
  torch::nn::Linear fc{nullptr};
};

at::Tensor t_scale(int index, at::Tensor x, double factor) { return x * factor + index; }
LSPAWN_REGISTER(t_scale);

// Returns the sum of the weights the worker sees, whether they require grad, and whether the
// parameter memory is the parent's (Fork) — by comparing data pointers passed in.
std::vector<double> t_model(int, lspawn::ModelWrapper<Net> model, int64_t parent_ptr) {
  auto& net = *model;
  const bool same_memory = reinterpret_cast<int64_t>(net.fc->weight.data_ptr()) == parent_ptr;
  // The worker can still train it: a write goes to its own copy of the page.
  at::Tensor out = net.fc->forward(at::ones({2, 64}));
  return {net.fc->weight.sum().item<double>() + net.fc->bias.sum().item<double>(),
          net.fc->weight.requires_grad() ? 1.0 : 0.0, same_memory ? 1.0 : 0.0, static_cast<double>(out.size(1))};
}
LSPAWN_REGISTER(t_model);

double t_allreduce(int index) {
  lspawn::World world = lspawn::init_process_group();
  std::vector<at::Tensor> t{at::full({4}, static_cast<double>(index + 1))};
  world.pg->allreduce(t)->wait();
  return t[0][0].item<double>();
}
LSPAWN_REGISTER(t_allreduce);

// Rank 1 never enters the second all_reduce (docs/hang-diagnosis.md).
int t_hang(int index) {
  lspawn::World world = lspawn::init_process_group();
  auto group = lspawn::Group::from_world(world);
  auto t = at::ones({4});
  lspawn::all_reduce(*group, t);
  if (index == 1)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
  lspawn::all_reduce(*group, t);
  return 0;
}
LSPAWN_REGISTER(t_hang);

// The launcher's SIGTERM lands while this rank unwinds: says "unwinding", then waits until lspawn's
// hold has the SIGTERM (TermHold::held()), at most 30 s. Without lspawn's hold that SIGTERM kills
// the rank before its report is written. The wait asks the hold rather than waiting for a
// nanosleep's EINTR: a SIGTERM that came between "unwinding" and the sleep (the peer acts on the
// file at once) was handled unseen, and the rank slept the whole 30 s into the grace period's
// SIGKILL (seen once in the clean-clone CI under load).
struct TermDuringUnwind {
  std::string dir;
  ~TermDuringUnwind() {
    lspawn::test::write_file(dir + "/unwinding", "1");
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!lspawn::TermHold::held() && std::chrono::steady_clock::now() < end) {
      struct timespec ts {
        0, 10'000'000
      };
      ::nanosleep(&ts, nullptr);
    }
  }
};

// Rank 0 throws, and unwinds slowly (as a process group's destructor does); rank 1 fails while
// it does, so lspawn sees rank 1 exit first and stops rank 0 mid-unwind.
int t_unwind_term(int index, std::string dir) {
  lspawn::World world = lspawn::init_process_group();  // what a worker that fails has built
  if (index == 0) {
    TermDuringUnwind slow{dir};
    throw std::runtime_error("rank 0 failed first");
  }
  lspawn::test::wait_file(dir + "/unwinding", std::chrono::seconds(30));
  std::fflush(nullptr);
  std::_Exit(3);
}
LSPAWN_REGISTER(t_unwind_term);

const StartMethod kMethods[] = {StartMethod::Fork, StartMethod::Spawn, StartMethod::Forkserver};

SpawnOptions quiet(StartMethod m, int nprocs) {
  SpawnOptions o;
  o.start_method = m;
  o.nprocs = nprocs;
  o.on_info = [](const std::string&) {};
  // Fork after LibTorch ran an op: its intra-op pool may have started (at::set_num_threads(1)
  // in main keeps it single-threaded, so Fork is allowed).
  return o;
}

}  // namespace

TEST_CASE("tensor codec round-trips dtype, shape and values") {
  const at::Tensor x = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor y = lspawn::Codec<at::Tensor>::decode(lspawn::Codec<at::Tensor>::encode(x));
  CHECK(y.scalar_type() == at::kFloat);
  CHECK(y.sizes() == x.sizes());
  CHECK(at::equal(x, y));
  const auto garbage = lspawn::proto::Value::of_tensor("not a pickle");
  CHECK_THROWS_AS(lspawn::Codec<at::Tensor>::decode(garbage), lspawn::CodecError);
  CHECK_THROWS_WITH(lspawn::Codec<at::Tensor>::decode(lspawn::Codec<int>::encode(1)),
                    Catch::Contains("expected a value of kind tensor"));
}

TEST_CASE("tensors travel as spawn arguments and results") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  const at::Tensor x = at::arange(6, at::kDouble);
  auto ctx = lspawn::spawn(t_scale, std::make_tuple(x, 2.0), quiet(m, 2));
  const auto r = ctx.results<at::Tensor>();
  REQUIRE(r.size() == 2);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(r[i]);
    CHECK(at::equal(*r[i], x * 2.0 + i));
  }
}

TEST_CASE("ModelWrapper hands the parent's model to every worker") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  auto net = std::make_shared<Net>();
  const double expected = net->fc->weight.sum().item<double>() + net->fc->bias.sum().item<double>();
  lspawn::ModelWrapper<Net> wrapped(net);
  const auto ptr = reinterpret_cast<int64_t>(net->fc->weight.data_ptr());
  auto ctx = lspawn::spawn(t_model, std::make_tuple(wrapped, ptr), quiet(m, 2));
  for (const auto& r : ctx.results<std::vector<double>>()) {
    REQUIRE(r);
    CHECK((*r)[0] == Approx(expected));
    CHECK((*r)[1] == 1.0);                                   // still a trainable parameter
    CHECK((*r)[2] == (m == StartMethod::Fork ? 1.0 : 0.0));  // Fork: the very same memory
    CHECK((*r)[3] == 32.0);
  }
}

TEST_CASE("ModelWrapper refuses a worker model of another shape") {
  auto other = std::make_shared<torch::nn::Module>();
  other->register_parameter("w", at::zeros({3}));
  lspawn::ModuleSnapshot snap(*other);
  Net net;
  CHECK_THROWS_WITH(lspawn::ModuleSnapshot::load_into(net, snap.value()), Catch::Contains("parameters and buffers"));
}

TEST_CASE("workers form a gloo process group with the env contract spawn() gives them") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  auto ctx = lspawn::spawn(t_allreduce, quiet(m, 3));
  for (const auto& r : ctx.results<double>()) CHECK(r == 6.0);  // 1 + 2 + 3
}

TEST_CASE("a temporary ModelWrapper stays valid until join=false workers have started") {
  for (StartMethod m : {StartMethod::Spawn, StartMethod::Forkserver}) {
    INFO("start method " << lspawn::start_method_name(m));
    SpawnOptions o = quiet(m, 2);
    o.join = false;
    auto net = std::make_shared<Net>();
    const double expected = net->fc->weight.sum().item<double>() + net->fc->bias.sum().item<double>();
    // The wrapper is a temporary: only the ProcessContext keeps a copy (and the snapshot).
    auto ctx = lspawn::spawn(t_model, std::make_tuple(lspawn::ModelWrapper<Net>(net), int64_t{0}), o);
    CHECK(ctx.join());
    for (const auto& r : ctx.results<std::vector<double>>()) {
      REQUIRE(r);
      CHECK((*r)[0] == Approx(expected));
    }
  }
}

TEST_CASE("hang_timeout: join() throws HangError naming the rank that never entered the collective") {
  SpawnOptions o = quiet(StartMethod::Fork, 2);
  o.hang_timeout = std::chrono::seconds(1);
  o.grace_period = std::chrono::seconds(1);
  std::string report;
  try {
    lspawn::spawn(t_hang, o);
  } catch (const lspawn::HangError& e) {
    report = e.report();
  }
  INFO(report);
  REQUIRE(!report.empty());
  CHECK(report.find("waiting: rank 0 in all_reduce #2 on group world, 16 B") != std::string::npos);
  CHECK(report.find("behind: rank 1 has not entered a collective for ") != std::string::npos);
  CHECK(report.find("main thread of rank 1 (pid ") != std::string::npos);
}

TEST_CASE("spawn: the rank that threw first is the root cause, though it was stopped while unwinding") {
  const StartMethod m = GENERATE(from_range(std::begin(kMethods), std::end(kMethods)));
  INFO("start method " << lspawn::start_method_name(m));
  lspawn::test::TempDir dir;
  SpawnOptions o = quiet(m, 2);
  o.grace_period = std::chrono::seconds(30);  // the hold, not SIGKILL, decides
  try {
    lspawn::spawn(t_unwind_term, std::make_tuple(dir.path), o);
    FAIL("spawn did not throw");
  } catch (const lspawn::ProcessRaisedException& e) {
    // Its report was written before the SIGTERM acted, dated by the throw (before rank 1's exit).
    CHECK(e.index() == 0);
    CHECK(e.what_text() == "rank 0 failed first");
  } catch (const lspawn::ProcessExitedException& e) {
    FAIL("the root cause is not the rank that threw first: " << e.what());
  }
  CHECK(lspawn::test::path_exists(dir.path + "/unwinding"));
}
