// ModelWrapper<M>: a model built once in the parent and handed to every spawn() worker without
// a copy per worker, in the spirit of torch_xla's MpModelWrapper.
//
//   auto wrapped = lspawn::ModelWrapper<Net>(std::make_shared<Net>());   // parent, once
//   lspawn::spawn(train, std::make_tuple(wrapped), opts);
//   void train(int index, lspawn::ModelWrapper<Net> model) { auto net = model.get(); ... }
//
// How each start method gets the model to the worker:
//   - Fork: the worker uses the parent's object itself; its memory is shared copy-on-write, so
//     4 workers holding a 500 MB model cost about one model until they write to it.
//   - Spawn / Forkserver: the first time the wrapper is encoded, the parent writes a snapshot
//     of every parameter and buffer (raw bytes, page-aligned) to one file in /dev/shm (or
//     $TMPDIR). Each worker default-constructs M and maps the file MAP_PRIVATE under its
//     parameters and buffers: the pages are shared among workers (page cache) until a worker
//     writes to them (then that page is copied for it). Parameters keep requires_grad.
//
// Requirements: M derives from torch::nn::Module; for Spawn / Forkserver it is
// default-constructible and builds the same parameter and buffer names and shapes as the
// parent's instance (the usual case: the same constructor). Snapshot tensors are CPU.
// Ownership: the snapshot file belongs to the wrapper and its copies in the parent (spawn()'s
// ProcessContext holds one until its workers have finished) and is removed with the last.
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "spawn/codec.hpp"

namespace lspawn {

// A module's parameters and buffers written to a file once (the parent side of ModelWrapper).
class ModuleSnapshot {
 public:
  // Writes every named parameter and buffer of `module` (recursively) to a new file.
  // Throws sys::SysError / std::runtime_error naming the file.
  explicit ModuleSnapshot(const torch::nn::Module& module);
  ~ModuleSnapshot();  // removes the file
  ModuleSnapshot(const ModuleSnapshot&) = delete;
  ModuleSnapshot& operator=(const ModuleSnapshot&) = delete;

  // [path, [[name, dtype, [sizes...], offset, nbytes]...]]: what crosses the process boundary.
  const proto::Value& value() const { return value_; }
  const std::string& path() const { return path_; }

  // Worker side: maps the snapshot described by `v` under the parameters and buffers of
  // `module` (same names and shapes). Throws CodecError naming the first mismatch.
  static void load_into(torch::nn::Module& module, const proto::Value& v);

 private:
  std::string path_;
  proto::Value value_;
};

template <class M>
class ModelWrapper {
 public:
  static_assert(std::is_base_of_v<torch::nn::Module, M>, "ModelWrapper<M>: M must derive from torch::nn::Module");

  explicit ModelWrapper(std::shared_ptr<M> model)
      : model_(std::move(model)), snapshot_(std::make_shared<std::shared_ptr<ModuleSnapshot>>()) {}

  // The model (in the parent: the one given; in a worker: see the class comment).
  const std::shared_ptr<M>& get() const { return model_; }
  M& operator*() const { return *model_; }
  M* operator->() const { return model_.get(); }

  // Codec support: the snapshot's description (written on first use).
  proto::Value encode() const {
    if (!*snapshot_) *snapshot_ = std::make_shared<ModuleSnapshot>(*model_);
    return (*snapshot_)->value();
  }
  static ModelWrapper decode(const proto::Value& v) {
    if constexpr (std::is_default_constructible_v<M>) {
      auto model = std::make_shared<M>();
      ModuleSnapshot::load_into(*model, v);
      return ModelWrapper(std::move(model));
    } else {
      throw CodecError(
          "ModelWrapper<M>: M is not default-constructible; only StartMethod::Fork "
          "can hand it to the workers");
    }
  }

 private:
  std::shared_ptr<M> model_;
  // One slot shared by every copy made in the parent (spawn() encodes a copy of the caller's
  // wrapper): the snapshot lives while any of them does.
  std::shared_ptr<std::shared_ptr<ModuleSnapshot>> snapshot_;
};

template <class M>
struct Codec<ModelWrapper<M>> {
  using is_lspawn_codec = void;
  static proto::Value encode(const ModelWrapper<M>& w) { return w.encode(); }
  static ModelWrapper<M> decode(const proto::Value& v) { return ModelWrapper<M>::decode(v); }
};

}  // namespace lspawn
