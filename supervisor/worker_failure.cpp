#include "supervisor/worker_failure.hpp"

#include <signal.h>

#include <atomic>
#include <exception>
#include <mutex>

namespace lspawn {
namespace {

std::mutex g_mutex;
int g_depth = 0;                   // TermHolds alive with the handler installed
volatile sig_atomic_t g_held = 0;  // a SIGTERM came while unwinding or reporting
std::atomic<int> g_reporting{0};   // TermHold::Reporting alive, on any thread
static_assert(std::atomic<int>::is_always_lock_free, "read in a signal handler");

void on_term(int sig) {
  // std::uncaught_exceptions() reads this thread's exception globals: no lock, no allocation.
  if (std::uncaught_exceptions() > 0 || g_reporting.load(std::memory_order_acquire) > 0) {
    g_held = 1;
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Whether `sig`'s disposition is the plain handler `h` (SIG_DFL, SIG_IGN, or ours).
bool disposition_is(int sig, void (*h)(int)) {
  struct sigaction current {};
  return ::sigaction(sig, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == h;
}

}  // namespace

TermHold::TermHold() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_depth > 0) {
    ++g_depth;
    active_ = true;
    return;
  }
  if (!disposition_is(SIGTERM, SIG_DFL)) return;  // the program handles (or ignores) SIGTERM itself
  struct sigaction hold {};
  hold.sa_handler = on_term;
  sigemptyset(&hold.sa_mask);
  hold.sa_flags = SA_RESTART;  // what the unwinding was waiting for goes on waiting
  if (::sigaction(SIGTERM, &hold, nullptr) != 0) return;
  g_depth = 1;
  active_ = true;
}

TermHold::~TermHold() {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (--g_depth > 0) return;
  // SIG_DFL is what it replaced, unless the program installed a handler of its own meanwhile.
  if (disposition_is(SIGTERM, on_term)) ::signal(SIGTERM, SIG_DFL);
  if (g_held) {
    g_held = 0;
    ::raise(SIGTERM);
  }
}

bool TermHold::held() { return g_held != 0; }

TermHold::Reporting::Reporting() { g_reporting.fetch_add(1, std::memory_order_acq_rel); }
TermHold::Reporting::~Reporting() { g_reporting.fetch_sub(1, std::memory_order_acq_rel); }

namespace {
std::atomic<ThrowClock> g_throw_clock{nullptr};
}  // namespace

void set_throw_clock(ThrowClock clock) { g_throw_clock.store(clock, std::memory_order_release); }

int64_t throw_time_us(const std::exception_ptr& error) {
  const ThrowClock clock = g_throw_clock.load(std::memory_order_acquire);
  return clock != nullptr && error ? clock(error) : 0;
}

bool ignore_sigpipe_if_default() {
  if (disposition_is(SIGPIPE, SIG_DFL)) ::signal(SIGPIPE, SIG_IGN);
  return disposition_is(SIGPIPE, SIG_IGN);
}

}  // namespace lspawn
