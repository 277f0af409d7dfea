#include "collectives/strategy_ops.hpp"

#include "collectives/error.hpp"
#include "collectives/object.hpp"
#include "collectives/ops.hpp"

#include <sstream>

namespace lspawn {

at::Tensor StrategyCollectives::all_gather(const at::Tensor& tensor) { return lspawn::all_gather(*group_, tensor); }

c10::IValue StrategyCollectives::reduce(const c10::IValue& value, ReduceOp op) {
  if (!value.isTensor()) return value;
  auto t = value.toTensor().clone();
  all_reduce(*group_, t, op);
  return t;
}

c10::IValue StrategyCollectives::broadcast(const c10::IValue& value, int src) {
  return broadcast_object(*group_, value, src);
}

bool StrategyCollectives::reduce_boolean_decision(bool decision, bool all) {
  return lspawn::reduce_boolean_decision(*group_, decision, all);
}

void StrategyCollectives::barrier(const std::string& name) {
  // FNV-1a of the name; the all_gather doubles as the barrier.
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ULL;
  auto mine = at::full({1}, static_cast<std::int64_t>(h), at::kLong);
  auto all = lspawn::all_gather(*group_, mine);
  auto a = all.accessor<std::int64_t, 2>();
  std::vector<int> odd;
  for (int q = 1; q < group_->size(); ++q)
    if (a[q][0] != a[0][0]) odd.push_back(q);
  if (odd.empty()) return;
  std::ostringstream msg;
  msg << "lspawn barrier('" << name << "') on " << group_->describe()
      << ": collective mismatch: ranks at a barrier with another name than rank 0's:";
  for (int q : odd) msg << " " << q;
  throw CollectiveMismatch("barrier", group_->name(), odd, msg.str());
}

}  // namespace lspawn
