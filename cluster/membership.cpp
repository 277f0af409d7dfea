#include "cluster/membership.hpp"

#include <algorithm>
#include <map>
#include <numeric>

namespace lspawn::node {

NodeRanks assign_node_ranks(const std::vector<int>& given, const std::vector<std::string>& who, int nnodes) {
  NodeRanks out;
  out.rank = given;
  std::map<int, size_t> taken;  // rank -> the node that has it
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i] < 0) continue;
    if (given[i] >= nnodes) {
      out.problem = who[i] + " has --node-rank " + std::to_string(given[i]) + " >= --nnodes " + std::to_string(nnodes);
      return out;
    }
    if (auto it = taken.find(given[i]); it != taken.end()) {
      out.problem = who[it->second] + " and " + who[i] + " both have --node-rank " + std::to_string(given[i]);
      return out;
    }
    taken[given[i]] = i;
  }
  int next = 0;
  for (size_t i = 0; i < out.rank.size(); ++i) {
    if (out.rank[i] >= 0) continue;
    while (taken.count(next)) ++next;
    out.rank[i] = next;
    taken[next] = i;
  }
  return out;
}

std::vector<int> elastic_node_ranks(const std::vector<int>& survivor_ranks, int admitted) {
  std::vector<size_t> by_old(survivor_ranks.size());
  std::iota(by_old.begin(), by_old.end(), size_t{0});
  std::stable_sort(by_old.begin(), by_old.end(),
                   [&](size_t a, size_t b) { return survivor_ranks[a] < survivor_ranks[b]; });
  std::vector<int> out(survivor_ranks.size() + static_cast<size_t>(std::max(admitted, 0)));
  for (size_t k = 0; k < by_old.size(); ++k) out[by_old[k]] = static_cast<int>(k) + 1;
  for (size_t k = survivor_ranks.size(); k < out.size(); ++k) out[k] = static_cast<int>(k) + 1;
  return out;
}

}  // namespace lspawn::node
