// compat::make_reducer(): c10d::Reducer (DDP's engine) built the same way on both LibTorch lines
// (runtime/torch_compat.hpp says what differs between them). Apart from torch_compat.hpp because
// c10d::Reducer's header is heavy, and on Debian's 1.13 it includes a header Debian does not
// ship (strategies/shim/ stands in for it, on the include path of lspawn_strategies only): only
// code that builds a Reducer (strategies/ddp.cpp) includes this one. It does not depend on what
// was included before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "runtime/torch_compat.hpp"

namespace lspawn::compat {

// What a Reducer is built from (the arguments both lines share), named.
struct ReducerArgs {
  std::vector<at::Tensor> params;                   // leaves that require grad, in module order
  std::vector<std::vector<size_t>> bucket_indices;  // buckets, in the order their all-reduce starts
  std::vector<size_t> per_bucket_size_limits;       // bytes, one per bucket (1.13 takes them)
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;
  int64_t bucket_bytes_cap = c10d::kDefaultBucketBytesCap;
  int64_t first_bucket_bytes_cap = c10d::kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  std::unordered_map<size_t, std::string> param_names;  // index in params → qualified name
};

// Constructs c10d::Reducer as torch.nn.parallel.DistributedDataParallel does. Its constructor's
// arguments changed over the releases; the richest form the headers offer is used (detected, not
// by version number), with what DDP passes for the arguments lspawn does not choose:
//   (params, buckets, pg, sparse, cap, unused, view, names, first cap, skip_all_reduce_unused=false,
//    use_python_reducer=false, bucket_bytes_cap_list={})          2.15 (and later 2.x)
//   the same without the trailing arguments, one at a time         2.x in between
//   (params, buckets, per-bucket limits, pg, sparse, cap, unused, view, names, first cap)
//                                                                   1.13 and 2.4-2.5
template <typename R = c10d::Reducer>
inline std::shared_ptr<R> make_reducer(ReducerArgs a) {
  using PG = c10::intrusive_ptr<c10d::ProcessGroup>;
  using Sparse = std::vector<bool>;
  using Names = std::unordered_map<size_t, std::string>;
  using Params = std::vector<at::Tensor>;
  using Buckets = std::vector<std::vector<size_t>>;
  Sparse sparse(a.params.size(), false);
  if constexpr (std::is_constructible_v<R, Params, Buckets, PG, Sparse, int64_t, bool, bool, Names, int64_t, bool, bool,
                                        std::vector<int64_t>>) {
    return std::make_shared<R>(std::move(a.params), std::move(a.bucket_indices), a.process_group, std::move(sparse),
                               a.bucket_bytes_cap, a.find_unused_parameters, a.gradient_as_bucket_view,
                               std::move(a.param_names), a.first_bucket_bytes_cap, false, false,
                               std::vector<int64_t>{});
  } else if constexpr (std::is_constructible_v<R, Params, Buckets, PG, Sparse, int64_t, bool, bool, Names, int64_t,
                                               bool, bool>) {
    return std::make_shared<R>(std::move(a.params), std::move(a.bucket_indices), a.process_group, std::move(sparse),
                               a.bucket_bytes_cap, a.find_unused_parameters, a.gradient_as_bucket_view,
                               std::move(a.param_names), a.first_bucket_bytes_cap, false, false);
  } else if constexpr (std::is_constructible_v<R, Params, Buckets, PG, Sparse, int64_t, bool, bool, Names, int64_t,
                                               bool>) {
    return std::make_shared<R>(std::move(a.params), std::move(a.bucket_indices), a.process_group, std::move(sparse),
                               a.bucket_bytes_cap, a.find_unused_parameters, a.gradient_as_bucket_view,
                               std::move(a.param_names), a.first_bucket_bytes_cap, false);
  } else if constexpr (std::is_constructible_v<R, Params, Buckets, PG, Sparse, int64_t, bool, bool, Names, int64_t>) {
    return std::make_shared<R>(std::move(a.params), std::move(a.bucket_indices), a.process_group, std::move(sparse),
                               a.bucket_bytes_cap, a.find_unused_parameters, a.gradient_as_bucket_view,
                               std::move(a.param_names), a.first_bucket_bytes_cap);
  } else {
    static_assert(std::is_constructible_v<R, Params, Buckets, const std::vector<size_t>&, PG, Sparse, int64_t, bool,
                                          bool, Names, int64_t>,
                  "lspawn: this LibTorch's c10d::Reducer constructor has a form runtime/torch_compat.hpp "
                  "does not know");
    return std::make_shared<R>(std::move(a.params), std::move(a.bucket_indices), a.per_bucket_size_limits,
                               a.process_group, std::move(sparse), a.bucket_bytes_cap, a.find_unused_parameters,
                               a.gradient_as_bucket_view, std::move(a.param_names), a.first_bucket_bytes_cap);
  }
}

}  // namespace lspawn::compat
