#include "strategies/checkpoint.hpp"

#include "sys/sys.hpp"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace lspawn {

std::map<std::string, at::Tensor> module_state(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> state;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    state[p.key()] = p.value().detach().to(at::kCPU).clone();
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state[b.key()] = b.value().detach().to(at::kCPU).clone();
  return state;
}

void load_module_state(torch::nn::Module& module, const std::map<std::string, at::Tensor>& state) {
  at::NoGradGuard no_grad;
  auto copy = [&](const std::string& name, at::Tensor& dst) {
    auto it = state.find(name);
    if (it == state.end()) throw CheckpointError("checkpoint has no entry '" + name + "' for the module");
    if (it->second.sizes() != dst.sizes())
      throw CheckpointError("checkpoint entry '" + name + "' has shape " + c10::str(it->second.sizes()) +
                            ", the module's is " + c10::str(dst.sizes()));
    dst.copy_(it->second);
  };
  for (auto& p : module.named_parameters(true)) copy(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) copy(b.key(), b.value());
}

Checkpoint Checkpoint::capture(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer, int64_t epoch,
                               int64_t global_step) {
  Checkpoint c;
  c.epoch = epoch;
  c.global_step = global_step;
  c.model = module_state(module);
  if (optimizer) {
    torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    archive.save_to([&](const void* data, size_t n) {
      c.optimizer.append(static_cast<const char*>(data), n);
      return n;
    });
  }
  return c;
}

void Checkpoint::restore(torch::nn::Module& module, torch::optim::Optimizer* optimizer) const {
  load_module_state(module, model);
  if (optimizer && !this->optimizer.empty()) {
    torch::serialize::InputArchive archive;
    archive.load_from(this->optimizer.data(), this->optimizer.size());
    optimizer->load(archive);
  }
}

namespace {

void write_atomic(const std::string& path, const std::vector<char>& bytes) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  sys::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw CheckpointError("checkpoint " + path + ": open " + tmp + ": " + std::strerror(errno));
  try {
    sys::write_all(fd.get(), std::string_view(bytes.data(), bytes.size()), "checkpoint " + tmp);
    if (::fsync(fd.get()) != 0) sys::throw_errno("fsync", "checkpoint " + tmp);
    sys::close(fd.release());
    if (::rename(tmp.c_str(), path.c_str()) != 0) sys::throw_errno("rename", "checkpoint " + tmp + " -> " + path);
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    throw CheckpointError(std::string("checkpoint ") + path + ": " + e.what());
  }
  sys::Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d) ::fsync(d.get());  // best effort: the rename is durable once the directory is
}

}  // namespace

void write_checkpoint_file(const Checkpoint& ckpt, const std::string& path) {
  c10::Dict<std::string, at::Tensor> model;
  for (const auto& [k, v] : ckpt.model) model.insert(k, v);
  c10::Dict<std::string, double> metrics;
  for (const auto& [k, v] : ckpt.metrics) metrics.insert(k, v);
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("format", int64_t{1});
  root.insert("epoch", ckpt.epoch);
  root.insert("global_step", ckpt.global_step);
  root.insert("model", model);
  root.insert("optimizer", ckpt.optimizer);
  root.insert("metrics", metrics);
  write_atomic(path, torch::jit::pickle_save(c10::IValue(root)));
}

Checkpoint read_checkpoint_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("checkpoint " + path + ": cannot open: " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    const auto root = torch::jit::pickle_load(bytes).toGenericDict();
    if (root.at("format").toInt() != 1)
      throw CheckpointError("unknown format " + std::to_string(root.at("format").toInt()));
    Checkpoint c;
    c.epoch = root.at("epoch").toInt();
    c.global_step = root.at("global_step").toInt();
    for (const auto& e : root.at("model").toGenericDict()) c.model[e.key().toStringRef()] = e.value().toTensor();
    c.optimizer = root.at("optimizer").toStringRef();
    for (const auto& e : root.at("metrics").toGenericDict()) c.metrics[e.key().toStringRef()] = e.value().toDouble();
    return c;
  } catch (const CheckpointError& e) {
    throw CheckpointError("checkpoint " + path + ": " + e.what());
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + path + " is not a readable lspawn checkpoint: " + e.what());
  }
}

}  // namespace lspawn
