// What a node group (node_group.hpp) is told about its job: the lspawn command line's multi-node
// flags and the callbacks it reports through. Read by each of its parts: the rendezvous
// (rendezvous.hpp), elastic admission (admission.hpp), the links (links.hpp) and the round
// driver (node_group.hpp).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "cluster/node_channel.hpp"

namespace lspawn::node {

// (Named NodeGroupOptions, not GroupOptions: lspawn::GroupOptions is the collectives' group's.)
struct NodeGroupOptions {
  std::string endpoint_addr = "127.0.0.1";     // static: --master-addr; else the rdzv host
  int endpoint_port = 0;                       // static: --master-port; else the rdzv port
  bool static_mode = true;                     // node 0 hosts; false: whoever binds the endpoint
  int nnodes = 1;                              // --nnodes N, or MAX of MIN:MAX
  int min_nnodes = 0;                          // MIN of --nnodes MIN:MAX (rdzv mode); 0: fixed
  std::chrono::milliseconds last_call{30000};  // elastic: wait for more once MIN have joined
  int node_rank = -1;                          // -1: assigned (rdzv mode only)
  int nproc_per_node = 1;
  int max_restarts = 0;
  std::vector<int> no_restart_exit_codes;  // the coordinator's decide (round.hpp)
  std::string run_id;                      // empty: the coordinator draws one
  std::chrono::milliseconds node_timeout{30000};
  std::chrono::milliseconds rdzv_timeout{600000};
  std::string host;  // this node's name, for reports
  // Rendezvous mode (--rdzv-endpoint) only: the address this node advertises for its workers'
  // store should it become node 0 (--local-addr; reserved there, so it must be one of this
  // host's). Empty: the rendezvous host on the node hosting the rendezvous, else the local
  // address of this node's connection to it.
  std::string local_addr;
  std::function<void(const std::string&)> info;  // informational lines; may be null
  // Hang diagnosis across nodes: the messages "status", "stacks?" and "stacks" (node_channel.hpp)
  // that came from node `from` (its node rank). May be null (they are then dropped).
  std::function<void(int from, const Message&)> on_hang_message;
};

// --nnodes MIN:MAX with MIN < MAX (min_nnodes 0: a fixed count).
inline bool is_elastic(int min_nnodes, int nnodes) { return min_nnodes > 0 && min_nnodes < nnodes; }

// "2:3" (elastic) or "2": the --nnodes flag, for reports.
inline std::string nnodes_flag(int min_nnodes, int nnodes) {
  return is_elastic(min_nnodes, nnodes) ? std::to_string(min_nnodes) + ":" + std::to_string(nnodes)
                                        : std::to_string(nnodes);
}

}  // namespace lspawn::node
