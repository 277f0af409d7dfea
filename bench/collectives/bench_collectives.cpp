// lspawn_bench_collectives: op x size x backend sweep of lspawn collectives, nccl-tests style.
//
//   lspawn --nprocs 2 lspawn_bench_collectives [--ops all_reduce,broadcast,all_gather]
//        [--backends shm,gloo,auto,nccl,c10d] [--min-bytes 4] [--max-bytes 64M] [--step 4]
//        [--budget-ms 300] [--json FILE] [--label NAME] [--device cpu|cuda]
//
// --backends c10d: all_reduce/broadcast on World::pg itself (c10d's ProcessGroup, as a user's
// `world.pg->allreduce(...)`), whose ops the status record follows (runtime/recorded_backend.hpp).
// --device cuda: the tensors live on cuda:(LOCAL_RANK mod the visible devices): shm stages them
// through pinned host memory (docs/shm-backend.md#cuda-tensors), gloo through its own host copy,
// nccl works on the device (one GPU per rank). Each timed run ends by reading one element back,
// which waits for the device's stream. Barriers, the op count and the slowest rank's time go
// through a gloo group of their own on the CPU.
//
// Reads its place in the job from the env contract (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT…)
// through runtime's init_process_group(). Each point: 3 warm-up ops, then a count of ops chosen
// from the fastest of 5 more to last about --budget-ms (5..2000), timed between two barriers; the time of the
// slowest rank is reported. Sizes are float32 bytes per rank (all_gather: bytes each rank sends).
// busbw as nccl-tests: all_reduce algbw*2(n-1)/n, all_gather algbw*(n-1) (per-rank bytes),
// broadcast algbw.
#include <lspawn/collectives.hpp>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<std::string> ops = {"all_reduce", "broadcast", "all_gather"};
  std::vector<std::string> backends = {"shm", "gloo"};
  std::int64_t min_bytes = 4;
  std::int64_t max_bytes = 64 << 20;
  int step = 4;
  double budget_ms = 300;
  std::string json;
  std::string label = "lspawn";
  std::string device = "cpu";
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::int64_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  const double v = std::stod(s, &pos);
  const std::string unit = s.substr(pos);
  double m = 1;
  if (unit == "K" || unit == "KiB")
    m = 1024;
  else if (unit == "M" || unit == "MiB")
    m = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    m = 1024.0 * 1024 * 1024;
  else if (!unit.empty())
    throw std::invalid_argument("bad size '" + s + "' (use 4, 4K, 64M)");
  return static_cast<std::int64_t>(v * m);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--ops")
      a.ops = split(value());
    else if (k == "--backends")
      a.backends = split(value());
    else if (k == "--min-bytes")
      a.min_bytes = parse_bytes(value());
    else if (k == "--max-bytes")
      a.max_bytes = parse_bytes(value());
    else if (k == "--step")
      a.step = std::stoi(value());
    else if (k == "--budget-ms")
      a.budget_ms = std::stod(value());
    else if (k == "--json")
      a.json = value();
    else if (k == "--label")
      a.label = value();
    else if (k == "--device")
      a.device = value();
    else
      throw std::invalid_argument("unknown argument " + k + " (see the header of bench_collectives.cpp)");
  }
  if (a.step < 2) throw std::invalid_argument("--step must be >= 2");
  if (a.device != "cpu" && a.device != "cuda")
    throw std::invalid_argument("--device: '" + a.device + "' is not cpu or cuda");
  return a;
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather") return n - 1;
  return 1.0;
}

struct Runner {
  lspawn::Group& g;
  std::string op;
  at::Tensor in, out;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // backend "c10d": World::pg itself, not a Group
  void once() {
    if (pg) {
      std::vector<at::Tensor> v{in};
      if (op == "all_reduce")
        pg->allreduce(v)->wait();
      else if (op == "broadcast")
        pg->broadcast(v)->wait();
      else
        throw std::invalid_argument("backend c10d: op " + op + " is not measured (all_reduce, broadcast)");
      return;
    }
    if (op == "all_reduce")
      lspawn::all_reduce(g, in);
    else if (op == "broadcast")
      lspawn::broadcast(g, in, 0);
    else if (op == "all_gather")
      lspawn::all_gather_async(g, in, out).wait();
    else
      throw std::invalid_argument("unknown op " + op);
  }
};

// Max over ranks of a double, through the group (also a barrier).
double max_over_ranks(lspawn::Group& g, double v) {
  auto t = at::full({1}, v, at::kDouble);
  lspawn::all_reduce(g, t, lspawn::ReduceOp::Max);
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    lspawn::World world = lspawn::init_process_group();
    const int n = world.size(), rank = world.rank();
    c10::Device device(c10::kCPU);
    if (args.device == "cuda") {
      const auto visible = static_cast<int>(torch::cuda::device_count());
      if (visible == 0) throw std::invalid_argument("--device cuda: no CUDA device is visible to this LibTorch");
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.env.local_rank % visible));
      c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(device);
    }
    const auto floats = at::TensorOptions().dtype(at::kFloat).device(device);
    // Waits for the device's work (one element read back) and for every rank.
    lspawn::GroupOptions to;
    to.backend = lspawn::Backend::Gloo;
    to.name = "bench-timing";
    auto timing = lspawn::Group::from_world(world, to);
    auto settle = [&](const at::Tensor& t) {
      if (device.is_cuda()) (void)t.reshape({-1}).narrow(0, 0, 1).cpu();
    };
    struct Row {
      std::string op, backend;
      std::int64_t bytes;
      double time_us, algbw, busbw;
    };
    std::vector<Row> rows;
    if (rank == 0) {
      std::printf("# lspawn_bench_collectives: nprocs %d, float32 on %s, ops", n, device.str().c_str());
      for (auto& o : args.ops) std::printf(" %s", o.c_str());
      std::printf(", backends");
      for (auto& b : args.backends) std::printf(" %s", b.c_str());
      std::printf("\n# %-11s %-9s %12s %12s %12s %12s\n", "op", "backend", "bytes", "time_us", "algbw_GB/s",
                  "busbw_GB/s");
      std::fflush(stdout);
    }
    for (const auto& backend : args.backends) {
      lspawn::GroupOptions go;
      go.backend = backend == "shm"                         ? lspawn::Backend::Shm
                   : backend == "gloo" || backend == "c10d" ? lspawn::Backend::Gloo
                   : backend == "nccl"                      ? lspawn::Backend::Nccl
                                                            : lspawn::Backend::Auto;
      go.name = "bench-" + backend;
      auto g = lspawn::Group::from_world(world, go);
      // "auto" is reported as what it chose ("shm+gloo" on one node, "hierarchical" across nodes).
      const std::string shown = backend == "auto" ? g->backend() : backend;
      for (const auto& op : args.ops) {
        for (std::int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= args.step) {
          const std::int64_t count = std::max<std::int64_t>(1, bytes / 4);
          Runner r{*g, op, at::full({count}, static_cast<float>(rank + 1), floats), at::Tensor(),
                   backend == "c10d" ? world.pg : c10::intrusive_ptr<c10d::ProcessGroup>()};
          if (op == "all_gather") r.out = at::empty({n, count}, floats);
          for (int i = 0; i < 3; ++i) r.once();
          settle(r.in);
          // The run is sized from the fastest of 5 more timed ops (the slowest rank's): one op
          // alone can include the ranks' start-up skew, and then too few ops are timed.
          lspawn::barrier(*timing);
          double fastest = 1e9;
          for (int i = 0; i < 5; ++i) {
            const auto t = Clock::now();
            r.once();
            settle(r.in);
            fastest = std::min(fastest, std::chrono::duration<double>(Clock::now() - t).count());
          }
          const double one = max_over_ranks(*timing, fastest);
          auto iters_t = at::full(
              {1}, static_cast<std::int64_t>(std::clamp(args.budget_ms / 1e3 / std::max(one, 1e-7), 5.0, 2000.0)),
              at::kLong);
          lspawn::broadcast(*timing, iters_t, 0);
          const auto iters = iters_t.item<std::int64_t>();
          lspawn::barrier(*timing);
          const auto t0 = Clock::now();
          for (std::int64_t i = 0; i < iters; ++i) r.once();
          settle(r.in);
          const double mine = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
          const double secs = max_over_ranks(*timing, mine);
          const double algbw = count * 4.0 / secs / 1e9;
          Row row{op, shown, count * 4, secs * 1e6, algbw, algbw * bus_factor(op, n)};
          rows.push_back(row);
          if (rank == 0) {
            std::printf("  %-11s %-9s %12lld %12.2f %12.3f %12.3f\n", op.c_str(), shown.c_str(),
                        static_cast<long long>(row.bytes), row.time_us, row.algbw, row.busbw);
            std::fflush(stdout);
          }
        }
      }
      lspawn::barrier(*timing);
    }
    if (rank == 0 && !args.json.empty()) {
      std::ofstream js(args.json);
      js << "[\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        js << "  {\"impl\": \"" << args.label << "-" << r.backend << "\", \"op\": \"" << r.op
           << "\", \"bytes\": " << r.bytes << ", \"nprocs\": " << n << ", \"backend\": \"" << r.backend
           << "\", \"time_us\": " << r.time_us << ", \"algbw_gbs\": " << r.algbw << ", \"busbw_gbs\": " << r.busbw
           << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      js << "]\n";
      if (!js) throw std::runtime_error("writing " + args.json + " failed");
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "lspawn_bench_collectives: " << e.what() << std::endl;
    return 1;
  }
}
