// The one place where lspawn meets the differences between the two LibTorch lines it builds
// against: Debian's LibTorch 1.13 and PyPI's LibTorch 2.x. Everything else in the tree is written
// once, against the functions here; no other file tests TORCH_VERSION_MAJOR.
//
// What differs (and is handled here):
//   - 1.13: ProcessGroupGloo / ProcessGroupNCCL *are* c10d::ProcessGroups.
//     2.x: they are c10d::Backends, and a c10d::ProcessGroup wraps one backend per device type.
//   - c10d::Reducer's constructor takes other arguments (DDP's engine, strategies/).
#pragma once

#include <torch/version.h>

#define LSPAWN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// ---- strategies/: autocast, and DDP's engine (c10d::Reducer) --------------------------------
#include <ATen/autocast_mode.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace lspawn::compat {

// Autocast state of one device type (CPU or CUDA): enabled flag and lower-precision dtype.
inline bool autocast_enabled(at::DeviceType type) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
inline at::ScalarType autocast_dtype(at::DeviceType type) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}
inline void set_autocast(at::DeviceType type, bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace lspawn::compat

// c10d::Reducer's header is heavy, and on Debian's 1.13 it includes a header Debian does not
// ship (strategies/shim/ stands in for it): only code that defines LSPAWN_COMPAT_REDUCER before
// including this file (strategies/ddp.cpp) gets make_reducer().
#ifdef LSPAWN_COMPAT_REDUCER
#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace lspawn::compat {

// What a Reducer is built from (the arguments both lines share), named.
struct ReducerArgs {
  std::vector<at::Tensor> params;                    // leaves that require grad, in module order
  std::vector<std::vector<size_t>> bucket_indices;   // buckets, in the order their all-reduce starts
  std::vector<size_t> per_bucket_size_limits;        // bytes, one per bucket (1.13 takes them)
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;
  int64_t bucket_bytes_cap = c10d::kDefaultBucketBytesCap;
  int64_t first_bucket_bytes_cap = c10d::kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  std::unordered_map<size_t, std::string> param_names;  // index in params → qualified name
};

// Constructs c10d::Reducer as torch.nn.parallel.DistributedDataParallel does on this line.
// 1.13: (params, buckets, per-bucket limits, pg, sparse, cap, unused, view, names, first cap).
// 2.x:  (params, buckets, pg, sparse, cap, unused, view, names, first cap,
//        skip_all_reduce_unused_params=false, use_python_reducer=false, bucket_bytes_cap_list={}).
inline std::shared_ptr<c10d::Reducer> make_reducer(ReducerArgs a) {
  std::vector<bool> expect_sparse(a.params.size(), false);
#if TORCH_VERSION_MAJOR >= 2
  return std::make_shared<c10d::Reducer>(std::move(a.params), std::move(a.bucket_indices), a.process_group,
                                         std::move(expect_sparse), a.bucket_bytes_cap, a.find_unused_parameters,
                                         a.gradient_as_bucket_view, std::move(a.param_names),
                                         a.first_bucket_bytes_cap, /*skip_all_reduce_unused_params=*/false,
                                         /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
#else
  return std::make_shared<c10d::Reducer>(std::move(a.params), std::move(a.bucket_indices),
                                         std::move(a.per_bucket_size_limits), a.process_group,
                                         std::move(expect_sparse), a.bucket_bytes_cap, a.find_unused_parameters,
                                         a.gradient_as_bucket_view, std::move(a.param_names),
                                         a.first_bucket_bytes_cap);
#endif
}

}  // namespace lspawn::compat
#endif  // LSPAWN_COMPAT_REDUCER
