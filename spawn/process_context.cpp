#include "spawn/process_context.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "supervisor/env_contract.hpp"
#include "hang/hang_watch.hpp"
#include "supervisor/job_secret.hpp"
#include "supervisor/port.hpp"
#include "spawn/errors.hpp"
#include "spawn/forked_workers.hpp"
#include "spawn/forkserver.hpp"
#include "supervisor/supervisor.hpp"
#include "placement/cpu_list.hpp"
#include "spawn/init_detail.hpp"
#include "spawn/threads.hpp"
#include "spawn/worker.hpp"
#include "hang/status_command.hpp"
#include "status/layout.hpp"
#include "proto/wire.hpp"

namespace lspawn {
namespace {

void reset_signal_handlers() {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
}

bool wants_result(ResultFrom from, int index) {
  return from == ResultFrom::All || (from == ResultFrom::Rank0 && index == 0);
}

// The caller's environment with opts.env merged in (the contract is applied on top of it).
std::vector<std::string> base_environment(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> out;
  for (auto& kv : env::current_environment()) {
    const std::string name = kv.substr(0, kv.find('='));
    if (!extra.count(name)) out.push_back(std::move(kv));
  }
  for (const auto& [k, v] : extra) out.push_back(k + "=" + v);
  return out;
}

}  // namespace

struct ProcessContext::Impl {
  SpawnOptions opts;
  int nprocs = 0;
  std::string run_dir;
  std::optional<PortReservation> port;
  std::unique_ptr<ConsoleSink> console;
  std::unique_ptr<lspawn::Forkserver> own_forkserver;  // destroyed after the supervisor
  lspawn::Forkserver* forkserver = nullptr;
  std::unique_ptr<Supervisor> sup;
  std::optional<ForkedWorkers> forked;  // with StartMethod::Forkserver
  std::vector<pid_t> pids;
  std::vector<std::string> result_paths;  // "" when not wanted
  std::vector<std::optional<proto::Value>> results;
  std::vector<WorkerResult> no_workers;
  std::shared_ptr<void> arguments;  // SpawnPlan::arguments, released once all workers are gone
  bool done = false;                // every worker gone; results read or failure recorded
  bool terminated = false;          // terminate() was called
  std::exception_ptr failure;       // what join() throws
  std::unique_ptr<HangWatch> hang;  // with SpawnOptions::hang_timeout
  std::string hang_report;          // set when the watchdog fired

  // Steps the supervisor until it finished or `deadline`, polling the hang watch on its deadlines.
  bool run_until(Clock::time_point deadline);

  void start(const SpawnPlan& plan);
  void finish();
  void cleanup() noexcept;
  ~Impl() { cleanup(); }

  // The steps of start(), in order.
  using InfoFn = std::function<void(const std::string&)>;
  struct Launch;
  void check_start_method(const SpawnPlan& plan, const std::string& what);
  void lease_forkserver(const std::string& what);
  SupervisorOptions supervisor_options();
  Launch prepare_launch(const SpawnPlan& plan, const InfoFn& info);
  void make_hang_watch(const std::string& status_dir, const InfoFn& info);
  void start_worker(const SpawnPlan& plan, const Launch& launch, int i);
};

namespace {

// "spawn(fn, nprocs=4, start_method=fork)": what every refusal of start() names.
std::string spawn_call_text(const SpawnPlan& plan, int nprocs, StartMethod method) {
  return std::string("spawn(") + (plan.function.empty() ? "<callable>" : plan.function) +
         ", nprocs=" + std::to_string(nprocs) + ", start_method=" + start_method_name(method) + ")";
}

// Under Fork every signal is blocked from the Supervisor's construction until the last worker is
// forked (see start()); restores the caller's mask when it goes.
struct MaskGuard {
  sigset_t caller_mask;
  bool restore = false;
  explicit MaskGuard(bool block) {
    ::pthread_sigmask(SIG_SETMASK, nullptr, &caller_mask);
    if (!block) return;
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    restore = true;
  }
  ~MaskGuard() {
    if (restore) ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
  }
  MaskGuard(const MaskGuard&) = delete;
  MaskGuard& operator=(const MaskGuard&) = delete;
};

}  // namespace

// What every worker of one start() shares: the job's side of the env contract, the caller's
// environment, the encoded arguments (not under Fork), the signal mask a forked child restores.
struct ProcessContext::Impl::Launch {
  env::JobEnv job;
  std::string status_dir;
  std::vector<std::string> base;
  proto::ValueList args;
  sigset_t caller_mask;
};

void ProcessContext::Impl::start(const SpawnPlan& plan) {
  const std::string what = spawn_call_text(plan, nprocs, opts.start_method);
  check_start_method(plan, what);
  run_dir = sys::make_temp_dir("lspawn-spawn-");
  try {
    port.emplace(opts.master_addr, opts.master_port);
  } catch (const std::exception& e) {
    throw SpawnError(what + ": cannot reserve MASTER_PORT: " + e.what());
  }
  const SupervisorOptions so = supervisor_options();
  // Fork children must not run the caller's signal handlers (a test framework's, an app's):
  // a signal can reach a child before its first instruction. So under Fork every signal is
  // blocked in this thread while the Supervisor is built (it records that mask as the
  // children's starting mask) and while the workers are forked; each child resets the
  // handlers, then restores the caller's mask. Exec'd children keep the caller's mask: exec
  // resets handlers by itself.
  const MaskGuard mask(opts.start_method == StartMethod::Fork);
  sup = std::make_unique<Supervisor>(so);
  Launch launch = prepare_launch(plan, so.on_info);
  launch.caller_mask = mask.caller_mask;
  pids.assign(static_cast<size_t>(nprocs), -1);
  results.assign(static_cast<size_t>(nprocs), std::nullopt);
  for (int i = 0; i < nprocs; ++i) start_worker(plan, launch, i);
}

// The refusals that come before anything starts, and the forkserver's lease.
void ProcessContext::Impl::check_start_method(const SpawnPlan& plan, const std::string& what) {
  const StartMethod method = opts.start_method;
  if (method == StartMethod::Fork) {
    const int threads = count_threads();
    const int baseline = init_detail::thread_baseline();
    if (threads > baseline) {
      const std::string why = what + ": this process runs " + std::to_string(threads) + " threads (" +
                              std::to_string(baseline) +
                              " when lspawn::init ran; LibTorch's thread pools and a process group start more); a "
                              "forked child keeps only the calling thread and may deadlock on locks the others held. "
                              "Use StartMethod::Forkserver (start it first thing in main: lspawn::init with "
                              "StartupOptions::start_forkserver) or StartMethod::Spawn";
      if (!opts.allow_fork_with_threads) {
        throw SpawnError(why + ", or set SpawnOptions::allow_fork_with_threads to fork anyway");
      }
      std::fprintf(stderr, "lspawn: warning: %s\n", why.c_str());
    }
  } else if (plan.function.empty()) {
    throw SpawnError(what +
                     ": the function is not registered; start methods other than Fork "
                     "run it in another program image and find it by name: add "
                     "LSPAWN_REGISTER(<function>) at namespace scope");
  }
  if (method == StartMethod::Spawn && !init_detail::initialized()) {
    throw SpawnError(what +
                     ": lspawn::init(argc, argv) was not called; StartMethod::Spawn "
                     "re-executes this program, whose main() must call it first");
  }
  if (method == StartMethod::Forkserver) lease_forkserver(what);
}

void ProcessContext::Impl::lease_forkserver(const std::string& what) {
  if (opts.forkserver && opts.forkserver->owner() != ::getpid()) {
    throw SpawnError(what + ": SpawnOptions::forkserver was started by process " +
                     std::to_string(opts.forkserver->owner()) + ", not by this one");
  }
  forkserver = opts.forkserver ? opts.forkserver : init_detail::default_forkserver();
  if (!forkserver) {
    own_forkserver = lspawn::Forkserver::start();
    forkserver = own_forkserver.get();
  }
  if (!forkserver->try_lease()) {
    forkserver = nullptr;
    throw SpawnError(what + ": the forkserver is in use by another unfinished ProcessContext");
  }
}

SupervisorOptions ProcessContext::Impl::supervisor_options() {
  SupervisorOptions so;
  so.run_dir = run_dir;
  so.grace_period = opts.grace_period;
  so.fail_fast = true;
  if (opts.sinks.empty()) {
    ConsoleSink::Options co;
    co.prefix = opts.prefix_output;
    console = std::make_unique<ConsoleSink>(co);
    so.sinks = {console.get()};
  } else {
    so.sinks = opts.sinks;
  }
  so.on_info = opts.on_info ? opts.on_info : [](const std::string& line) {
    std::fprintf(stderr, "lspawn: %s\n", line.c_str());
    std::fflush(stderr);
  };
  return so;
}

ProcessContext::Impl::Launch ProcessContext::Impl::prepare_launch(const SpawnPlan& plan, const InfoFn& info) {
  Launch l;
  l.job.master_addr = opts.master_addr;
  l.job.master_port = port->port();
  l.job.run_id = "spawn-" + std::to_string(::getpid());
  l.job.run_dir = run_dir;
  // The workers' status records (docs/hang-diagnosis.md), watched when hang_timeout is set.
  l.status_dir = run_dir + "/" + kStatusDirName;
  sys::make_dir(l.status_dir, 0700);
  if (opts.hang_timeout.count() > 0) make_hang_watch(l.status_dir, info);
  l.job.job_secret = generate_job_secret();  // docs/security.md
  l.base = base_environment(opts.env);
  const env::OmpDefault omp = env::omp_threads_default(l.base, nprocs, placement::usable_cpu_count());
  l.job.omp_threads = omp.threads;
  if (omp.threads > 0) {
    info("setting OMP_NUM_THREADS=" + std::to_string(omp.threads) + " for each of the " + std::to_string(nprocs) +
         " workers (their share of " + omp.why + "; set it to override)");
  }
  if (opts.start_method != StartMethod::Fork) l.args = plan.encode_args();
  return l;
}

void ProcessContext::Impl::make_hang_watch(const std::string& status_dir, const InfoFn& info) {
  HangWatchOptions ho;
  ho.dir = status_dir;
  ho.timeout = opts.hang_timeout;
  ho.timeout_flag = "SpawnOptions::hang_timeout";
  ho.print = [this, info](const std::string& text) {
    hang_report = text;
    std::string body = text;
    if (!body.empty() && body.back() == '\n') body.pop_back();
    // on_info adds its own "lspawn: " prefix.
    size_t pos = 0;
    while (pos <= body.size()) {
      const size_t nl = body.find('\n', pos);
      std::string line = body.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (line.rfind("lspawn: ", 0) == 0) line = line.substr(8);
      info(line);
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  };
  hang = std::make_unique<HangWatch>(std::move(ho));
}

void ProcessContext::Impl::start_worker(const SpawnPlan& plan, const Launch& launch, int i) {
  env::WorkerPlace place;
  place.local_rank = i;
  place.nproc_per_node = nprocs;
  std::vector<std::string> wenv = env::worker_environment(launch.job, place, launch.base);
  const std::string status_kv = std::string(status::kDirEnv) + "=";
  wenv.erase(std::remove_if(wenv.begin(), wenv.end(),
                            [&](const std::string& kv) { return kv.compare(0, status_kv.size(), status_kv) == 0; }),
             wenv.end());
  wenv.push_back(status_kv + launch.status_dir);
  const std::string error_file = env::error_file_path(run_dir, i);
  const std::string result_path =
      wants_result(opts.results, i) ? run_dir + "/result-" + std::to_string(i) : std::string();
  result_paths.push_back(result_path);

  if (opts.start_method == StartMethod::Fork) {
    ForkSpec spec;
    spec.error_file = error_file;
    spec.local_rank = i;
    const int n = nprocs;
    const auto& run_in_child = plan.run_in_child;  // the plan outlives start_fork
    const sigset_t caller_mask = launch.caller_mask;
    spec.fn = [&run_in_child, wenv, i, n, result_path, error_file, caller_mask]() -> int {
      reset_signal_handlers();
      ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
      ::clearenv();
      for (const auto& kv : wenv) ::putenv(const_cast<char*>(kv.c_str()));  // wenv lives on
      WorkerBody body;
      body.index = i;
      body.nprocs = n;
      body.result_path = result_path;
      body.error_file = error_file;
      body.call = [&] { return run_in_child(i); };
      return run_worker(body);
    };
    pids[i] = sup->start_fork(i, std::move(spec));
    return;
  }

  proto::SpawnCall call;
  call.version = wire::kSchemaVersion;
  call.function = plan.function;
  call.index = i;
  call.nprocs = nprocs;
  call.args = launch.args;
  call.want_result = !result_path.empty();
  call.result_path = result_path;
  if (opts.start_method == StartMethod::Spawn) {
    const std::string call_path = run_dir + "/call-" + std::to_string(i);
    write_frame_file(call_path, call);
    ExecSpec spec;
    spec.path = init_detail::executable();
    for (int a = 0; a < init_detail::argc(); ++a) spec.argv.emplace_back(init_detail::argv()[a]);
    spec.env = std::move(wenv);
    spec.env.push_back(std::string(kSpawnCallEnv) + "=" + call_path);
    spec.error_file = error_file;
    pids[i] = sup->start_exec(i, spec);
  } else {
    if (!forked) forked.emplace(*forkserver, *sup, "process");
    pids[i] = forked->start(i, call, wenv, error_file);
  }
}

bool ProcessContext::Impl::run_until(Clock::time_point deadline) {
  while (!sup->finished() && Clock::now() < deadline) {
    const auto due = hang ? std::min(deadline, hang->next_deadline()) : deadline;
    sup->step(due);
    if (!hang || Clock::now() < hang->next_deadline()) continue;
    if (hang->poll(Clock::now(), sup->results()) && !sup->finished() && !sup->root_cause()) {
      sup->terminate(SIGTERM, "the hang watchdog (SpawnOptions::hang_timeout)");
    }
  }
  return sup->finished();
}

void ProcessContext::Impl::finish() {
  done = true;
  if (!hang_report.empty() && hang && hang->fired() && !sup->root_cause()) {
    failure = std::make_exception_ptr(HangError(hang_report));
  } else if (sup->root_cause()) {
    const WorkerResult& r = sup->result(*sup->root_cause());
    if (r.report) {
      failure = std::make_exception_ptr(
          ProcessRaisedException(r.rank, r.pid, r.report->exception_type, r.report->message, r.report->backtrace));
    } else {
      failure = std::make_exception_ptr(ProcessExitedException(r.rank, r.pid, r.exit_code, r.term_signal));
    }
  } else if (!terminated) {
    for (const WorkerResult& r : sup->results()) {
      if (r.failed()) {  // stopped from outside (a signal to a worker nobody asked for)
        failure = std::make_exception_ptr(ProcessExitedException(r.rank, r.pid, r.exit_code, r.term_signal));
        break;
      }
    }
    if (!failure) {
      for (int i = 0; i < nprocs; ++i) {
        if (result_paths[i].empty()) continue;
        proto::SpawnResult res;
        try {
          read_frame_file(result_paths[i], res, opts.max_result_bytes);
        } catch (const std::exception& e) {
          failure = std::make_exception_ptr(
              SpawnError("process " + std::to_string(i) + " exited 0 but its result cannot be read: " + e.what()));
          break;
        }
        if (res.returned) results[i] = res.value;
      }
    }
  }
  cleanup();
}

void ProcessContext::Impl::cleanup() noexcept {
  if (forkserver) {
    if (forked) forked->unwatch();
    forkserver->end_lease();
    forkserver = nullptr;
  }
  port.reset();
  arguments.reset();
  if (!run_dir.empty()) {
    sys::remove_tree(run_dir);
    run_dir.clear();
  }
}

ProcessContext::ProcessContext(const SpawnPlan& plan, const SpawnOptions& opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
  impl_->nprocs = plan.nprocs;
  impl_->arguments = plan.arguments;
  try {
    impl_->start(plan);
  } catch (const SpawnError&) {
    impl_.reset();  // the supervisor kills and reaps whatever started
    throw;
  } catch (const std::exception& e) {
    impl_.reset();
    throw SpawnError(std::string("spawn: cannot start the workers: ") + e.what());
  }
}

ProcessContext::ProcessContext(std::vector<std::optional<proto::Value>> local_results)
    : impl_(std::make_unique<Impl>()) {
  impl_->nprocs = static_cast<int>(local_results.size());
  impl_->results = std::move(local_results);
  impl_->done = true;
}

ProcessContext::ProcessContext(ProcessContext&&) noexcept = default;

ProcessContext& ProcessContext::operator=(ProcessContext&& other) noexcept {
  if (this != &other) {
    release();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

ProcessContext::~ProcessContext() { release(); }

void ProcessContext::release() noexcept {
  if (!impl_ || impl_->done || !impl_->sup) return;
  try {
    if (impl_->opts.daemon) {
      terminate();
    } else {
      join();
    }
  } catch (...) {
    // Nothing to report from here; join() was the place to see the failure.
  }
}

const std::vector<pid_t>& ProcessContext::pids() const { return impl_->pids; }

bool ProcessContext::join(std::optional<std::chrono::milliseconds> timeout) {
  Impl& m = *impl_;
  if (!m.done) {
    if (!m.run_until(timeout ? Clock::now() + *timeout : Clock::time_point::max())) return false;
    m.finish();
  }
  if (m.failure) std::rethrow_exception(m.failure);
  return true;
}

void ProcessContext::terminate() {
  Impl& m = *impl_;
  if (m.done) return;
  m.terminated = true;
  m.sup->terminate(SIGTERM);
  m.sup->run();
  m.finish();
}

bool ProcessContext::finished() const { return impl_->done; }

const std::vector<std::optional<proto::Value>>& ProcessContext::raw_results() const {
  if (!impl_->done || impl_->failure) {
    throw SpawnError("ProcessContext::results(): the workers have not all finished successfully");
  }
  return impl_->results;
}

const std::vector<WorkerResult>& ProcessContext::workers() const {
  return impl_->sup ? impl_->sup->results() : impl_->no_workers;
}

}  // namespace lspawn
