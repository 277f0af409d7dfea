// Memory of spawn() workers holding one large model: the total PSS (proportional set size,
// /proc/<pid>/smaps_rollup) of the parent, 4 workers, each holding a ~512 MB model, and the
// helper processes (the launcher's guardian, the forkserver: forks that share pages too),
//   - with ModelWrapper (the parent builds the model once), under Fork, Spawn, Forkserver;
//   - without it (each worker builds its own model), under Fork.
// Each worker reads every parameter (so its pages are really mapped) then waits until the
// parent has measured.
//
// Usage: spawn_pss_bench [--nprocs 4] [--mb 512] [--modes fork-wrapper,fork-own,...]
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <lspawn/model_wrapper.hpp>
#include <lspawn/spawn.hpp>

namespace {

// A model of `mb` MiB of float parameters in 64 MiB layers (default-constructible: the size
// comes from the environment, so a worker started by exec builds the same shapes).
struct BigModel : torch::nn::Module {
  BigModel() {
    const char* mb_env = std::getenv("PSS_BENCH_MB");
    const int64_t mb = mb_env ? std::atoll(mb_env) : 512;
    const int64_t layer_floats = 16 * 1024 * 1024;  // 64 MiB
    for (int64_t i = 0; i < mb / 64; ++i) {
      layers.push_back(register_parameter("w" + std::to_string(i), at::rand({layer_floats}, at::kFloat)));
    }
  }
  std::vector<at::Tensor> layers;
};

double touch(const torch::nn::Module& m) {
  double s = 0;
  for (const auto& p : m.parameters()) s += p.sum().item<double>();
  return s;
}

int64_t pss_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (in >> key) {
    if (key == "Pss:") {
      in >> value >> unit;
      return value;
    }
    std::getline(in, unit);
  }
  return -1;
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

// Every descendant of `root` (children, grandchildren, ...), from /proc/<pid>/stat.
std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      const pid_t pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
      std::string stat;
      std::getline(in, stat);
      const auto paren = stat.rfind(')');
      if (paren == std::string::npos) continue;
      std::istringstream rest(stat.substr(paren + 2));
      char state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      parent_of.emplace_back(pid, ppid);
    }
    ::closedir(d);
  }
  std::vector<pid_t> out{root};
  for (size_t i = 0; i < out.size(); ++i) {
    for (const auto& [pid, ppid] : parent_of) {
      if (ppid == out[i]) out.push_back(pid);
    }
  }
  out.erase(out.begin());
  return out;
}

void hold_model(int index, lspawn::ModelWrapper<BigModel> wrapped, bool own, std::string dir) {
  std::shared_ptr<BigModel> model = own ? std::make_shared<BigModel>() : wrapped.get();
  const double s = touch(*model);
  std::ofstream(dir + "/ready-" + std::to_string(index)) << s;
  while (!exists(dir + "/go")) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}
LSPAWN_REGISTER(hold_model);

}  // namespace

int main(int argc, char** argv) {
  lspawn::StartupOptions startup;
  startup.start_forkserver = true;
  lspawn::init(argc, argv, startup);
  int nprocs = 4;
  std::string mb = "512";
  std::string modes = "fork-wrapper,fork-own,forkserver-wrapper,spawn-wrapper";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--nprocs")
      nprocs = std::atoi(argv[i + 1]);
    else if (flag == "--mb")
      mb = argv[i + 1];
    else if (flag == "--modes")
      modes = argv[i + 1];
  }
  ::setenv("PSS_BENCH_MB", mb.c_str(), 1);
  at::set_num_threads(1);  // keep the parent single-threaded: Fork is refused otherwise
  const auto model = std::make_shared<BigModel>();
  lspawn::ModelWrapper<BigModel> wrapped(model);
  const int64_t model_kb = [&] {
    int64_t b = 0;
    for (const auto& p : model->parameters()) b += static_cast<int64_t>(p.nbytes());
    return b / 1024;
  }();
  std::printf("model: %.0f MiB of parameters; %d workers\n", model_kb / 1024.0, nprocs);
  std::printf("%-20s %12s %12s %12s %12s %10s\n", "mode", "parent MiB", "workers MiB", "helpers MiB", "total MiB",
              "x model");

  std::stringstream ms(modes);
  std::string mode;
  while (std::getline(ms, mode, ',')) {
    const bool own = mode.find("-own") != std::string::npos;
    lspawn::SpawnOptions o;
    o.nprocs = nprocs;
    o.join = false;
    o.on_info = [](const std::string&) {};
    o.start_method = mode.rfind("forkserver", 0) == 0 ? lspawn::StartMethod::Forkserver
                     : mode.rfind("spawn", 0) == 0    ? lspawn::StartMethod::Spawn
                                                      : lspawn::StartMethod::Fork;
    char tmpl[] = "/tmp/lspawn-pss-XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    try {
      auto ctx = lspawn::spawn(hold_model, std::make_tuple(wrapped, own, dir), o);
      for (int i = 0; i < nprocs; ++i) {
        while (!exists(dir + "/ready-" + std::to_string(i))) {
          if (ctx.join(std::chrono::milliseconds(10))) break;
        }
      }
      const int64_t parent = pss_kb(::getpid());
      int64_t workers = 0, helpers = 0;
      for (pid_t p : ctx.pids()) workers += pss_kb(p);
      // The launcher's guardian and the forkserver share pages with the parent too: count
      // every other descendant as a helper, so the total covers the whole job.
      for (pid_t p : descendants(::getpid())) {
        bool is_worker = false;
        for (pid_t w : ctx.pids()) is_worker = is_worker || w == p;
        if (!is_worker) helpers += std::max<int64_t>(0, pss_kb(p));
      }
      std::ofstream(dir + "/go") << 1;
      ctx.join();
      const int64_t total = parent + workers + helpers;
      std::printf("%-20s %12.0f %12.0f %12.0f %12.0f %10.2f\n", mode.c_str(), parent / 1024.0, workers / 1024.0,
                  helpers / 1024.0, total / 1024.0, static_cast<double>(total) / model_kb);
    } catch (const std::exception& e) {
      std::printf("%-20s failed: %s\n", mode.c_str(), e.what());
    }
    std::fflush(stdout);
    for (int i = 0; i < nprocs; ++i) ::unlink((dir + "/ready-" + std::to_string(i)).c_str());
    ::unlink((dir + "/go").c_str());
    ::rmdir(dir.c_str());
  }
  return 0;
}
