// Group::from_world: a Group over runtime's World (built only with runtime/).
#include "collectives/group.hpp"

#include "runtime/process_group.hpp"

namespace lspawn {

std::shared_ptr<Group> Group::from_world(const World& world, GroupOptions options) {
  if (options.timeout.count() <= 0 && world.timeout.count() > 0) options.timeout = world.timeout;
  // A world on NCCL (CUDA tensors) keeps NCCL unless the caller chose otherwise.
  if (options.backend == Backend::Default && world.backend == "nccl") options.backend = Backend::Nccl;
  // Across nodes, gloo binds where the world's does (the address that routes to MASTER_ADDR, or
  // LSPAWN_GLOO_HOST): a host name need not resolve on every node.
  if (options.gloo_host.empty() && world.env.group_world_size > 1) options.gloo_host = world.gloo_host;
  // The world's store is shared with runtime; work under our own prefix inside it.
  if (options.name.empty()) options.name = "world";
  return create(world.store, world.rank(), world.size(), std::move(options));
}

}  // namespace lspawn
