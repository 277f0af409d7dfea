// Group::from_world: a Group over runtime's World (built only with runtime/).
#include "collectives/group.hpp"

#include "runtime/process_group.hpp"

namespace lspawn {

std::shared_ptr<Group> Group::from_world(const World& world, GroupOptions options) {
  if (options.timeout.count() <= 0 && world.timeout.count() > 0) options.timeout = world.timeout;
  // A world on NCCL (CUDA tensors) keeps NCCL unless the caller chose otherwise.
  if (options.backend == Backend::Default && world.backend == "nccl") options.backend = Backend::Nccl;
  // The world's store is shared with runtime; work under our own prefix inside it.
  if (options.name.empty()) options.name = "world";
  return create(world.store, world.rank(), world.size(), std::move(options));
}

}  // namespace lspawn
