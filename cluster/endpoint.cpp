#include "cluster/endpoint.hpp"

#include "sys/duration_text.hpp"

namespace lspawn::node {

using std::chrono::milliseconds;

std::string endpoint_of(const NodeGroupOptions& o) { return o.endpoint_addr + ":" + std::to_string(o.endpoint_port); }

bool not_our_frames(const LinkError& e) {
  const std::string why = e.what();
  return why.rfind("bad frame", 0) == 0 || why.rfind("connection closed inside a frame", 0) == 0;
}

void accept_nodes(int listener, const std::string& ep, milliseconds node_timeout, int max,
                  const std::function<void(std::unique_ptr<Link>, std::string)>& add,
                  const std::function<void(const std::string&)>& beyond) {
  for (int i = 0;; ++i) {
    if (i >= max && !beyond) return;
    sys::Fd fd = sys::tcp_accept(listener, "rendezvous on " + ep);
    if (!fd) return;
    std::string endpoint = sys::peer_endpoint(fd.get());
    if (i >= max) {
      beyond(endpoint);
      continue;  // fd closes here
    }
    sys::tcp_set_liveness(fd.get(), node_timeout, "rendezvous on " + ep);
    const std::string peer = sys::peer_ip(fd.get());
    add(std::make_unique<Link>(std::move(fd), "node at " + peer), std::move(endpoint));
  }
}

std::string join_overdue(const std::string& ep, const std::string& endpoint, milliseconds node_timeout) {
  return "rendezvous on " + ep + ": closed connection from " + endpoint + ": no join message within " +
         seconds_text(node_timeout) + " (--node-timeout)";
}

std::string join_mismatch(const NodeGroupOptions& o, const JoinMsg& j) {
  const auto min_of = [](int min, int max) { return is_elastic(min, max) ? min : 0; };
  if (j.version != kProtocolVersion) {
    return "speaks control protocol " + std::to_string(j.version) + ", this lspawn " + std::to_string(kProtocolVersion);
  }
  if (j.nnodes != o.nnodes || min_of(j.min_nnodes, j.nnodes) != min_of(o.min_nnodes, o.nnodes)) {
    return "has --nnodes " + nnodes_flag(j.min_nnodes, j.nnodes) + ", node 0 " + nnodes_flag(o.min_nnodes, o.nnodes);
  }
  if (j.nproc_per_node != o.nproc_per_node) {
    return "has --nproc-per-node " + std::to_string(j.nproc_per_node) + ", this node " +
           std::to_string(o.nproc_per_node) + " (every node must run the same number)";
  }
  if (!j.run_id.empty() && !o.run_id.empty() && j.run_id != o.run_id) {
    return "has run id '" + j.run_id + "', this node '" + o.run_id + "'";
  }
  if (j.max_restarts != o.max_restarts) {
    return "has --max-restarts " + std::to_string(j.max_restarts) + ", this node " + std::to_string(o.max_restarts);
  }
  if (is_elastic(o.min_nnodes, o.nnodes) && j.node_rank >= 0) {
    return "has --node-rank " + std::to_string(j.node_rank) + ": an elastic job numbers its nodes itself";
  }
  return "";
}

}  // namespace lspawn::node
