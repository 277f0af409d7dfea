#include "spawn/init.hpp"
#include "spawn/init_detail.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "supervisor/env_contract.hpp"
#include "supervisor/install_layout.hpp"
#include "spawn/errors.hpp"
#include "spawn/forkserver.hpp"
#include "spawn/registry.hpp"
#include "spawn/threads.hpp"
#include "spawn/worker.hpp"
#include "proto/wire.hpp"

namespace lspawn {
namespace {

struct ProgramImage {
  bool initialized = false;
  int thread_baseline = 1;
  std::string exe;
  std::vector<std::string> args;
  std::vector<char*> argv;  // into args, null-terminated
  std::unique_ptr<Forkserver> forkserver;
};

ProgramImage& image() {
  static ProgramImage* p = new ProgramImage;  // never destroyed: workers may outlive statics
  return *p;
}

[[noreturn]] void run_spawned_worker(const std::string& call_path) {
  proto::SpawnCall call;
  WorkerBody body;
  if (const char* ef = std::getenv(env::kErrorFile)) body.error_file = ef;
  // Index and size from the env contract until the call is read (for the error report).
  if (const char* r = std::getenv(env::kRank)) body.index = std::atoi(r);
  if (const char* w = std::getenv(env::kWorldSize)) body.nprocs = std::atoi(w);
  // run_worker() reads body.result_path after body.call() returns: the call fills it in once
  // the SpawnCall is read, so a worker whose call cannot be read still writes a report.
  body.call = [&]() -> std::optional<proto::Value> {
    read_frame_file(call_path, call, 1u << 30);
    wire::check_version(call.version, "SpawnCall");
    body.index = call.index;
    body.nprocs = call.nprocs;
    if (call.want_result) body.result_path = call.result_path;
    const Invoker* invoker = FunctionRegistry::global().find(call.function);
    if (!invoker) {
      throw SpawnError(
          "function '" + call.function +
          "' is not registered in this program (LSPAWN_REGISTER); registered: " + FunctionRegistry::global().names());
    }
    return (*invoker)(call.index, call.args);
  };
  const int code = run_worker(body);
  std::fflush(nullptr);
  std::exit(code);
}

}  // namespace

void init(int argc, char** argv, const StartupOptions& opts) {
  if (const char* call = std::getenv(kSpawnCallEnv)) {
    const std::string path = call;
    ::unsetenv(kSpawnCallEnv);  // the worker's own children are callers, not workers
    run_spawned_worker(path);
  }
  ProgramImage& img = image();
  if (img.initialized) return;
  img.exe = layout::program_path();
  if (img.exe.empty() && argc > 0) img.exe = argv[0];
  for (int i = 0; i < argc; ++i) img.args.emplace_back(argv[i]);
  if (img.args.empty()) img.args.push_back(img.exe);
  for (auto& a : img.args) img.argv.push_back(a.data());
  img.argv.push_back(nullptr);
  img.initialized = true;
  img.thread_baseline = std::max(1, count_threads());
  if (opts.start_forkserver) img.forkserver = Forkserver::start();
}

namespace init_detail {
bool initialized() { return image().initialized; }
const char* executable() { return image().exe.c_str(); }
int argc() { return static_cast<int>(image().args.size()); }
char* const* argv() { return image().argv.data(); }
int thread_baseline() { return image().thread_baseline; }
Forkserver* default_forkserver() {
  Forkserver* fs = image().forkserver.get();
  return fs && fs->owner() == ::getpid() ? fs : nullptr;  // not in a forked copy of the owner
}
}  // namespace init_detail

}  // namespace lspawn
