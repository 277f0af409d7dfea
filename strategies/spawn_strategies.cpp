#include "strategies/spawn_strategies.hpp"

#include "spawn/serial_executor.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace lspawn {

namespace {

nlohmann::json loader_json(const LoaderOptions& o) {
  return {{"batch_size", o.batch_size}, {"shuffle", o.shuffle}, {"seed", o.seed}, {"drop_last", o.drop_last}};
}
LoaderOptions loader_from(const nlohmann::json& j) {
  LoaderOptions o;
  o.batch_size = j.at("batch_size").get<int64_t>();
  o.shuffle = j.at("shuffle").get<bool>();
  o.seed = j.at("seed").get<uint64_t>();
  o.drop_last = j.at("drop_last").get<bool>();
  return o;
}

}  // namespace

std::string to_json_text(const SpawnFitConfig& c) {
  nlohmann::json j;
  j["version"] = 1;
  j["kind"] = c.kind;
  j["ddp"] = {{"accelerator", to_string(c.ddp.accelerator)},
              {"precision", to_string(c.ddp.precision)},
              {"backend", to_string(c.ddp.backend)},
              {"timeout_ms", c.ddp.timeout.count()},
              {"bucket_cap_bytes", c.ddp.bucket_cap_bytes},
              {"first_bucket_cap_bytes", c.ddp.first_bucket_cap_bytes},
              {"find_unused_parameters", c.ddp.find_unused_parameters},
              {"broadcast_buffers", c.ddp.broadcast_buffers},
              {"gradient_as_bucket_view", c.ddp.gradient_as_bucket_view},
              {"shm_comm_hook", c.ddp.shm_comm_hook}};
  j["trainer"] = {
      {"max_epochs", c.trainer.max_epochs},         {"accumulate_grad_batches", c.trainer.accumulate_grad_batches},
      {"checkpoint_dir", c.trainer.checkpoint_dir}, {"keep_every_epoch", c.trainer.keep_every_epoch},
      {"resume_from", c.trainer.resume_from},       {"progress_bar", c.trainer.progress_bar},
      {"print_epochs", c.trainer.print_epochs}};
  j["train_loader"] = loader_json(c.train_loader);
  j["val_loader"] = loader_json(c.val_loader);
  j["has_val"] = c.has_val;
  j["fit_started_ns"] = c.fit_started_ns;
  j["serial_marker"] = c.serial_marker;
  return j.dump();
}

SpawnFitConfig spawn_fit_config_from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("version").get<int>() != 1) throw std::runtime_error("unknown version");
    SpawnFitConfig c;
    c.kind = j.at("kind").get<std::string>();
    const auto& d = j.at("ddp");
    c.ddp.accelerator = parse_accelerator(d.at("accelerator").get<std::string>());
    c.ddp.precision = parse_precision(d.at("precision").get<std::string>());
    const std::string backend = d.at("backend").get<std::string>();
    for (Backend b : {Backend::Default, Backend::Auto, Backend::Gloo, Backend::Shm, Backend::Nccl})
      if (backend == to_string(b)) c.ddp.backend = b;
    c.ddp.timeout = std::chrono::milliseconds(d.at("timeout_ms").get<int64_t>());
    c.ddp.bucket_cap_bytes = d.at("bucket_cap_bytes").get<int64_t>();
    c.ddp.first_bucket_cap_bytes = d.at("first_bucket_cap_bytes").get<int64_t>();
    c.ddp.find_unused_parameters = d.at("find_unused_parameters").get<bool>();
    c.ddp.broadcast_buffers = d.at("broadcast_buffers").get<bool>();
    c.ddp.gradient_as_bucket_view = d.at("gradient_as_bucket_view").get<bool>();
    c.ddp.shm_comm_hook = d.at("shm_comm_hook").get<bool>();
    const auto& t = j.at("trainer");
    c.trainer.max_epochs = t.at("max_epochs").get<int64_t>();
    c.trainer.accumulate_grad_batches = t.at("accumulate_grad_batches").get<int64_t>();
    c.trainer.checkpoint_dir = t.at("checkpoint_dir").get<std::string>();
    c.trainer.keep_every_epoch = t.at("keep_every_epoch").get<bool>();
    c.trainer.resume_from = t.at("resume_from").get<std::string>();
    c.trainer.progress_bar = t.at("progress_bar").get<bool>();
    c.trainer.print_epochs = t.at("print_epochs").get<bool>();
    c.train_loader = loader_from(j.at("train_loader"));
    c.val_loader = loader_from(j.at("val_loader"));
    c.has_val = j.at("has_val").get<bool>();
    c.fit_started_ns = j.at("fit_started_ns").get<int64_t>();
    c.serial_marker = j.at("serial_marker").get<std::string>();
    return c;
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("spawn strategy: bad worker configuration: ") + e.what());
  }
}

std::unique_ptr<Strategy> make_worker_strategy(const SpawnFitConfig& c) {
  // nprocs = 1: spawn() runs the function in the caller, without an env contract (no job to
  // join): train on one device, as Lightning's ddp_spawn does with one device.
  if (std::getenv("WORLD_SIZE") == nullptr) return std::make_unique<SingleDevice>(c.ddp.accelerator, c.ddp.precision);
  if (c.kind == "ddp") return std::make_unique<DDP>(c.ddp);
  if (c.kind == "xla") return std::make_unique<XLA>(static_cast<const ParallelOptions&>(c.ddp));
  throw std::invalid_argument("spawn strategy: unknown kind '" + c.kind + "' (expected ddp or xla)");
}

SpawnFitReturn run_spawn_fit(int index, TrainingModule& module, const SpawnFitConfig& c,
                             const std::vector<at::Tensor>& train, const std::vector<at::Tensor>& val) {
  if (!c.serial_marker.empty()) {
    // One preparation per node: the first worker through the lock creates the marker.
    SerialExecutor executor;
    executor.run([&] {
      struct stat st;
      if (::stat(c.serial_marker.c_str(), &st) != 0) {
        const int fd = ::open(c.serial_marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
          const std::string who = std::to_string(index) + "\n";
          if (::write(fd, who.data(), who.size()) < 0) { /* the marker's existence is what counts */
          }
          ::close(fd);
        }
      }
    });
  }
  auto strategy = make_worker_strategy(c);
  Trainer trainer(*strategy, c.trainer);
  DataLoader train_loader(TensorDataset(train), c.train_loader);
  std::optional<DataLoader> val_loader;
  if (c.has_val) val_loader.emplace(TensorDataset(val), c.val_loader);
  const FitResult r = trainer.fit(module, train_loader, val_loader);
  strategy->teardown();
  if (strategy->global_rank() != 0) return {};
  return SpawnFitReturn{module_state(module), r.metrics, r.last_checkpoint, r.epochs, r.global_step, r.first_step_ns};
}

SpawnFitResult SpawnStrategyBase::unpack(torch::nn::Module& module, const SpawnFitReturn& r, int64_t started_ns) {
  load_module_state(module, std::get<0>(r));
  SpawnFitResult out;
  out.metrics = std::get<1>(r);
  out.last_checkpoint = std::get<2>(r);
  out.epochs = std::get<3>(r);
  out.global_step = std::get<4>(r);
  out.first_step_ns = std::get<5>(r);
  out.time_to_first_step = out.first_step_ns > 0 ? (out.first_step_ns - started_ns) / 1e9 : 0.0;
  return out;
}

}  // namespace lspawn
