#include "collectives/object.hpp"

#include "collectives/error.hpp"
#include "collectives/ops.hpp"

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstring>
#include <sstream>

namespace lspawn {
namespace {

enum ObjectOp : std::int64_t { kBroadcast = 101, kAllGather, kGather, kScatter };

const char* object_op_name(std::int64_t op) {
  switch (op) {
    case kBroadcast: return "broadcast_object";
    case kAllGather: return "all_gather_object";
    case kGather: return "gather_object";
    case kScatter: return "scatter_object";
  }
  return "?";
}

std::vector<char> pickle(const c10::IValue& v) { return torch::jit::pickle_save(v); }

c10::IValue unpickle(const std::uint8_t* data, std::int64_t n) {
  std::vector<char> bytes(static_cast<std::size_t>(n));
  if (n) std::memcpy(bytes.data(), data, bytes.size());
  return torch::jit::pickle_load(bytes);
}

// Exchanges {op, root, bytes} between all ranks and checks that op and root agree.
// Returns (size, 3) int64. Throws CollectiveMismatch naming the ranks that differ from rank 0.
at::Tensor exchange_header(Group& g, std::int64_t op, int root, std::int64_t bytes) {
  auto mine = at::empty({3}, at::kLong);
  mine[0] = op;
  mine[1] = root;
  mine[2] = bytes;
  auto all = all_gather(g, mine);
  auto a = all.accessor<std::int64_t, 2>();
  std::vector<int> odd;
  for (int q = 1; q < g.size(); ++q)
    if (a[q][0] != a[0][0] || a[q][1] != a[0][1]) odd.push_back(q);
  if (!odd.empty()) {
    std::ostringstream msg;
    msg << "lspawn " << object_op_name(op) << " on " << g.describe() << ": collective mismatch: ";
    for (int q = 0; q < g.size(); ++q)
      msg << (q ? "; " : "") << "rank " << q << " called " << object_op_name(a[q][0]) << " with root " << a[q][1];
    msg << "; ranks differing from rank 0:";
    for (int q : odd) msg << " " << q;
    throw CollectiveMismatch(object_op_name(op), g.name(), odd, msg.str());
  }
  return all;
}

void validate_root(Group& g, const char* op, int root) {
  if (root < 0 || root >= g.size())
    throw std::invalid_argument(std::string("lspawn ") + op + " on " + g.describe() + ": root rank " +
                                std::to_string(root) + " is not in [0, " + std::to_string(g.size()) + ")");
}

}  // namespace

c10::IValue broadcast_object(Group& g, const c10::IValue& value, int src) {
  validate_root(g, "broadcast_object", src);
  std::vector<char> bytes;
  if (g.rank() == src) bytes = pickle(value);
  auto header = exchange_header(g, kBroadcast, src, static_cast<std::int64_t>(bytes.size()));
  const std::int64_t n = header[src][2].item<std::int64_t>();
  auto buffer = at::empty({n}, at::kByte);
  if (g.rank() == src && n) std::memcpy(buffer.data_ptr(), bytes.data(), static_cast<std::size_t>(n));
  broadcast(g, buffer, src);
  if (g.rank() == src) return value;
  return unpickle(buffer.data_ptr<std::uint8_t>(), n);
}

std::vector<c10::IValue> all_gather_object(Group& g, const c10::IValue& value) {
  const auto bytes = pickle(value);
  auto header = exchange_header(g, kAllGather, -1, static_cast<std::int64_t>(bytes.size()));
  const std::int64_t longest = header.select(1, 2).max().item<std::int64_t>();
  auto mine = at::zeros({longest}, at::kByte);
  if (!bytes.empty()) std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  auto all = all_gather(g, mine);
  std::vector<c10::IValue> out;
  for (int q = 0; q < g.size(); ++q)
    out.push_back(unpickle(all[q].data_ptr<std::uint8_t>(), header[q][2].item<std::int64_t>()));
  return out;
}

std::vector<c10::IValue> gather_object(Group& g, const c10::IValue& value, int dst) {
  validate_root(g, "gather_object", dst);
  // Small metadata: an all_gather (fast over shm) and the non-destination ranks drop the result.
  const auto bytes = pickle(value);
  auto header = exchange_header(g, kGather, dst, static_cast<std::int64_t>(bytes.size()));
  const std::int64_t longest = header.select(1, 2).max().item<std::int64_t>();
  auto mine = at::zeros({longest}, at::kByte);
  if (!bytes.empty()) std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
  auto all = all_gather(g, mine);
  std::vector<c10::IValue> out;
  if (g.rank() != dst) return out;
  for (int q = 0; q < g.size(); ++q)
    out.push_back(unpickle(all[q].data_ptr<std::uint8_t>(), header[q][2].item<std::int64_t>()));
  return out;
}

c10::IValue scatter_object(Group& g, const std::vector<c10::IValue>& values, int src) {
  validate_root(g, "scatter_object", src);
  const bool root = g.rank() == src;
  const bool bad = root && static_cast<int>(values.size()) != g.size();
  std::vector<std::vector<char>> parts;
  std::int64_t total = 0;
  if (root && !bad)
    for (const auto& v : values) {
      parts.push_back(pickle(v));
      total += static_cast<std::int64_t>(parts.back().size());
    }
  // A wrong count on src is reported to everybody (-1 bytes), so nobody waits for it.
  auto header = exchange_header(g, kScatter, src, bad ? -1 : total);
  const std::int64_t n = header[src][2].item<std::int64_t>();
  if (n < 0) {
    const std::string msg = "lspawn scatter_object on " + g.describe() + ": rank " + std::to_string(src) +
                            " must pass one value per rank (" + std::to_string(g.size()) + ")" +
                            (root ? ", got " + std::to_string(values.size()) : std::string());
    if (root) throw std::invalid_argument(msg);
    throw CollectiveError("scatter_object", g.name(), {src}, msg);
  }
  auto sizes = at::zeros({g.size()}, at::kLong);
  auto buffer = at::empty({n}, at::kByte);
  if (root) {
    std::int64_t off = 0;
    for (int q = 0; q < g.size(); ++q) {
      sizes[q] = static_cast<std::int64_t>(parts[q].size());
      if (!parts[q].empty()) std::memcpy(buffer.data_ptr<std::uint8_t>() + off, parts[q].data(), parts[q].size());
      off += static_cast<std::int64_t>(parts[q].size());
    }
  }
  broadcast(g, sizes, src);
  broadcast(g, buffer, src);
  auto s = sizes.accessor<std::int64_t, 1>();
  std::int64_t off = 0;
  for (int q = 0; q < g.rank(); ++q) off += s[q];
  return unpickle(buffer.data_ptr<std::uint8_t>() + off, s[g.rank()]);
}

bool reduce_boolean_decision(Group& g, bool decision, bool all) {
  auto t = at::full({1}, decision ? 1 : 0, at::kInt);
  all_reduce(g, t, ReduceOp::Sum);
  const int yes = t.item<int>();
  return all ? yes == g.size() : yes > 0;
}

}  // namespace lspawn
